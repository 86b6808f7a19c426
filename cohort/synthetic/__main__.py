"""``python -m cohort.synthetic``."""
from cohort.synthetic import main

raise SystemExit(main())
