"""forgetful: evaluation package.

``policies``       one selection-policy interface (SV, H2O-style density, H2O oracle, recency, random)
                   and ``select_top_k`` with deterministic tie-breaking.
``metrics``        event-hour retention, paired bootstrap intervals, AUROC/AUPRC with CIs, paired tests.
``audit_metrics``  gate-score gaps, coefficient-decay baseline, readout-weight leakage.
``clinical``       the clinical studies, one module each (``clinical.retention``: the seed's retention
                   protocol at the support-defined budget k = |S∪E|).

Imports go one way: evaluation → models → sv_core (never dashboards, cohort or pipelines).
"""
