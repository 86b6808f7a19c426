"""The issue-10 acceptance commands run and report exact completion (small sizes)."""
from sv_core.bench.degenerate import JITTERS, completion, fuzz


def test_completion_every_jitter_small():
    rows = completion(contexts=2)
    assert [r["jitter"] for r in rows] == list(JITTERS)
    for r in rows:
        assert r["complete_exact"] == 2, r
        assert r["admit_fail"] == r["forget_fail"] == r["refit_fail"] == 0


def test_fuzz_small():
    out = fuzz(sequences=15)
    assert out["ops"] == 300
    assert out["kkt_gt_1e-9"] == out["dev_gt_1e-6"] == out["errors_on_valid_input"] == 0


def test_audit_summaries_are_json_safe_when_a_class_is_empty():
    import json

    from sv_core import audit

    r = audit.run_audit(trials=1, regimes=["gaussian"], progress=False)
    json.dumps(r, allow_nan=False)  # an empty removal class is null, never NaN
    assert "gaussian" in audit.format_table(r)
