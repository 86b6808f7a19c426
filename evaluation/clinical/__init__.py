"""Clinical studies: pure functions over arrays and frames (no Prefect, no warehouse access).

Each study is one module here; its Prefect flow in ``pipelines/flows/`` reads the warehouse,
calls these functions on each stay's (or context's) arrays and writes the result file. Nothing is
imported eagerly: import the study module you need.

``retention``                  event-hour retention of every policy at the support-defined budget
                               (ICU retention, held-out SpO₂ control), the aggregation over stays,
                               the random baseline as its exact expectation and the low-power label
``retention_sensitivity``      the ν × σ sensitivity table (SV vs ridge and kernel leverage)
``retention_audit``            the independent refit as audit oracle of the certified solve, on a sample
``sampling``                   deterministic, seeded stay samples (``--stays N``) stable under rebuilds
``patient_deletion``           five-patient contexts, one patient forgotten (exact, naive, decay) and
                               compared with a same-C refit
``patient_deletion_result``    its aggregates over contexts and its result file
"""
