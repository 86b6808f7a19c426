"""forgetful: dashboards package.

Renders stored JSON study results (schema: dashboards/SCHEMA.md) into one self-contained HTML
report: ``python -m dashboards.report --runs runs --out report.html``. Imports no models; reads
aggregates only and refuses record identifiers (``dashboards.errors.AggregateOnlyError``).
"""
