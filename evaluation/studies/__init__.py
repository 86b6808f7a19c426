"""Synthetic, learned-key and retrieval-memory studies (pure functions returning result dicts).

Every ``run_*`` function takes explicit parameters and a seed, computes with the project's one
kernel (:func:`sv_core.rbf_kernel`), the exact fixed-C gate (:class:`sv_core.Gate` /
:func:`sv_core.refit`) and the one selection-policy interface (:mod:`evaluation.policies`), and
returns a dict in the shape of ``dashboards/SCHEMA.md`` (validated by the Prefect flows in
``pipelines/flows/study_*.py`` before they write it).

Modules
-------
``planted_secret``      exact decrement vs coefficient decay on a planted secret token
``skewed_redundancy``   matched-budget selection on skewed-redundancy contexts
``streaming_eviction``  online bounded-budget eviction (maintained gate vs streaming H2O)
``recall_tasks``        selective copying, capacity and the distinct-key MQAR control
``learned_keys``        trained MQAR model, frozen keys, forget/edit on the exact gate
``retrieval_memory``    forgettable fact memory over MiniLM sentence embeddings
``audit_regimes``       ICU-warehouse and learned-key regimes for :mod:`sv_core.audit`
``language_model``      SV hybrid vs matched sliding-window softmax language model (bits per byte)
"""
