"""Seed figures only beside runs on the seed's kind of data, with the right reason: one decision
(dashboards.seed_figures.seed_comparability) used by the result writer, the CLI lines, the report
and the generated docs."""
from __future__ import annotations

from dashboards import reproduce
from dashboards.seed_figures import seed_comparability, seed_line
from pipelines.runtime.runner import seed_only_where_comparable


def test_real_data_studies_on_synthetic_data_are_not_comparable_and_say_why():
    c = seed_comparability("patient_deletion", "synthetic")
    assert not c["comparable"] and "synthetic" in c["reason"] and "real MIMIC-IV" in c["reason"]
    for data in ("demo", "mimic", "clif"):
        assert seed_comparability("icu_retention", data) == {"comparable": True, "reason": None, "partial": None}
    assert seed_line("heldout_spo2", "synthetic", "0.464 vs 0.225").startswith("seed figure not shown, not comparable")
    assert seed_line("heldout_spo2", "demo", "0.464 vs 0.225") == "seed figure: 0.464 vs 0.225"


def test_synthetic_studies_with_synthetic_seed_figures_are_comparable():
    for study in ("skewed_redundancy", "planted_secret", "streaming_eviction", "learned_keys"):
        assert seed_comparability(study, "synthetic")["comparable"]
        assert seed_line(study, "synthetic", "x") == "seed figure: x"


def test_the_audit_is_comparable_except_its_mimic_row_on_synthetic_data():
    c = seed_comparability("deletion_audit", "synthetic")
    assert c["comparable"] and "MIMIC-IV row" in c["partial"]
    assert seed_comparability("deletion_audit", "demo")["partial"] is None


def test_the_result_writer_drops_a_non_comparable_seed_figure():
    r = {"study": "icu_retention", "data": "synthetic", "seed_figure": {"text": "0.80 vs 0.05"}, "notes": "n"}
    seed_only_where_comparable(r)
    assert r["seed_figure"] == {} and r["notes"].startswith("n · seed figure not shown, not comparable")
    s = {"study": "skewed_redundancy", "data": "synthetic", "seed_figure": {"text": "0.861"}}
    seed_only_where_comparable(s)
    assert s["seed_figure"] == {"text": "0.861"} and "notes" not in s


def test_docs_and_report_word_it_the_same_way(tmp_path):
    from dashboards.report import render_report
    from dashboards.schema import write_result

    base = {"runtime_s": 1.0, "seed_figure": {}, "metrics": {}, "tables": [], "figures": []}
    write_result({**base, "study": "icu_retention", "title": "ICU retention (synthetic)", "data": "synthetic"},
                 tmp_path / "icu_retention" / "result.json")
    write_result({**base, "study": "skewed_redundancy", "title": "Skewed", "data": "synthetic"},
                 tmp_path / "skewed_redundancy" / "result.json")
    md = reproduce.render_figures([tmp_path])
    icu = md[md.index("### ICU retention"):md.index("### Skewed")]
    assert "seed figure not comparable: this run used synthetic data" in icu
    assert "not comparable" not in md[md.index("### Skewed"):]
    page = render_report(tmp_path)
    ret = page[page.index('id="retention"'):page.index('id="heldout"')]
    assert "Not shown, not comparable: this run used synthetic data" in ret
    skew = page[page.index('id="study-skewed_redundancy"'):]
    skew = skew[:skew.index("</article>")]
    assert "not comparable" not in skew.lower() and "0.861" in skew


def _seed_citations(files) -> list[str]:
    """``file:line`` of every string (docstrings aside) that cites a seed paper (``seed 000 §`` /
    ``seed 001 §``): the seed's text lives in dashboards.seed_figures, flows take it from there."""
    import ast
    import re

    out = []
    for f in files:
        tree = ast.parse(f.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        out += [f"{f.name}:{n.lineno}" for n in ast.walk(tree) if isinstance(n, ast.Constant)
                and isinstance(n.value, str) and id(n) not in docs and re.search(r"seed 00[01] §", n.value)]
    return out


def test_flows_take_the_seed_text_from_the_one_table(tmp_path):
    from pathlib import Path

    import pipelines

    assert not _seed_citations(sorted(Path(pipelines.__file__).parent.rglob("*.py")))
    f = tmp_path / "flow.py"
    f.write_text('"""Retention (seed 001 §5)."""\nSEED = "seed 001 §5: 0.80 (SV) vs 0.05"\n')
    assert _seed_citations([f]) == ["flow.py:2"]
