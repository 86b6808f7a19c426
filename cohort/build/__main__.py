"""``python -m cohort.build``."""
from cohort.build import main

raise SystemExit(main())
