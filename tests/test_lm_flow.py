"""Language-model study: pieces with hand-checked values, and the tiny comparison end to end."""
from __future__ import annotations

import json
import math

import pytest
import torch

from evaluation.studies.language_model import (
    TINY,
    LMStudyError,
    get_batch,
    lr_at,
    paired_tests,
    run_comparison,
    split_corpus,
)
from models.corpus import CorpusMissingError, load_corpus


def _text(n=20_000, seed=0):
    g = torch.Generator().manual_seed(seed)
    words = [b"the ", b"cat ", b"sat ", b"on ", b"a ", b"mat. ", b"and ", b"dog "]
    idx = torch.randint(0, len(words), (n // 4,), generator=g).tolist()
    return b"".join(words[i] for i in idx)[:n]


def test_corpus_missing_raises_typed_error_with_fetch_hint(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGETFUL_DATA", str(tmp_path))
    with pytest.raises(CorpusMissingError, match="models.corpus fetch"):
        load_corpus()
    f = tmp_path / "x.bin"
    f.write_bytes(b"abcdef")
    assert load_corpus(f, max_bytes=3) == b"abc"


def test_batches_are_next_byte_shifted_and_split_90_10():
    data = bytes(range(200)) * 5
    train, val = split_corpus(data, 0.1, 8)
    assert len(val) == 100 and len(train) == 900
    x, y = get_batch(train, 8, 4, torch.Generator().manual_seed(0))
    assert x.shape == (4, 8) and torch.equal(x[:, 1:], y[:, :-1])
    with pytest.raises(LMStudyError):
        split_corpus(b"tiny", 0.1, 8)


def test_cosine_schedule_hand_values():
    cfg = TINY.__class__(steps=100, lr=1e-3, min_lr=1e-4, warmup_frac=0.1)
    assert lr_at(0, cfg) == pytest.approx(1e-4)  # (0+1)/10 of lr
    assert lr_at(10, cfg) == pytest.approx(1e-3)
    assert lr_at(55, cfg) == pytest.approx(1e-4 + 0.5 * 9e-4)  # half-way through the cosine
    assert lr_at(100, cfg) == pytest.approx(1e-4)


def test_paired_tests_hand_values():
    res = paired_tests([1.0, 2.0, 3.0], [1.5, 2.5, 3.75])
    assert res["mean_diff_swa_minus_sv"] == pytest.approx((0.5 + 0.5 + 0.75) / 3)
    diffs = [0.5, 0.5, 0.75]
    m = sum(diffs) / 3
    sd = math.sqrt(sum((d - m) ** 2 for d in diffs) / 2)
    assert res["t"] == pytest.approx(m / (sd / math.sqrt(3)))
    assert 0 < res["wilcoxon_p"] <= 1
    assert math.isnan(paired_tests([1.0], [2.0])["t_p"])


def test_tiny_comparison_end_to_end(tmp_path, capsys):
    res = run_comparison(TINY, [0, 1], _text(), progress=True)
    _check_progress_lines(capsys.readouterr().out.splitlines(), res)
    assert len(res["per_seed"]) == 2
    for row in res["per_seed"]:
        # the window is the hybrid's measured active state plus the chunk
        assert row["window"] == min(TINY.block, round(row["mean_active_state"]) + TINY.chunk)
        assert 0 < row["mean_active_state"] <= TINY.block
        assert 0.5 < row["sv_bpb"] < 9.0 and 0.5 < row["swa_bpb"] < 9.0
    assert math.isfinite(res["tests"]["t"])
    json.dumps(res)  # JSON-serialisable


def test_flow_writes_json_with_prefect(prefect_harness, tmp_path):
    from pipelines.flows.language_model import LMSettings, language_model_flow

    corpus = tmp_path / "c.txt"
    corpus.write_bytes(_text())
    out = tmp_path / "r.json"
    language_model_flow(corpus=str(corpus), out=str(out),
                        settings=LMSettings(protocol="tiny", seeds=(0,), references=("linear",)))
    from dashboards.schema import validate_result

    study = json.loads(out.read_text())
    validate_result(study)  # the report can render it
    assert study["study"] == "language_model" and study["data"] == "text"
    assert study["tables"][0]["rows"][0][0] == 0  # seed 0
    assert 0.5 < study["metrics"]["mean_sv_bpb"] < 9.0
    res = json.loads(out.with_name("details.json").read_text())
    assert res["kind"] == "language_model" and res["per_seed"][0]["seed"] == 0
    assert res["per_seed"][0]["sv_bpb"] == study["metrics"]["mean_sv_bpb"]
    assert [r["variant"] for r in res["references"]] == ["linear"]
    assert res["references"][0]["seed"] == 0 and 0.5 < res["references"][0]["best_val_bpb"] < 9.0
    assert res["protocol"] == "tiny+custom"  # tiny with seeds [0] instead of the protocol's 0 1 2
    assert study["metrics"]["protocol"] == "tiny+custom" and "not the seed's" in study["title"]


def _fake_runner(calls):
    """Records every training request; BPB encodes the variant so the wiring is checkable."""
    bpb = {"sv_hybrid": 2.0, "sliding": 2.5, "deltanet": 3.0, "linear": 3.5, "softmax": 1.5}

    def run(cfg, variant, seed, train, val, window, progress):
        calls.append((variant, seed, window))
        return {"variant": variant, "seed": seed, "window": window,
                "best_val_bpb": bpb[variant] + (0.02 if variant == "sliding" else 0.01) * seed,
                "mean_active_state": 10.0 if variant == "sv_hybrid" else float("nan"),
                "curve": [{"step": 1, "val_bpb": bpb[variant]}], "wall_s": 0.5,
                "params_non_embedding": 123}

    return run


def test_references_are_single_seed_rows_outside_the_paired_test():
    from pipelines.flows.language_model import REFERENCE_VARIANTS

    calls = []
    res = run_comparison(TINY, [3, 4], _text(), runner=_fake_runner(calls), progress=False,
                         references=["softmax", "deltanet", "linear", "softmax"])
    window = 10 + TINY.chunk
    assert calls == [("sv_hybrid", 3, None), ("sliding", 3, window), ("sv_hybrid", 4, None),
                     ("sliding", 4, window), ("softmax", 3, None), ("deltanet", 3, None),
                     ("linear", 3, None)]
    assert [r["variant"] for r in res["references"]] == ["softmax", "deltanet", "linear"]
    assert [r["best_val_bpb"] for r in res["references"]] == [1.53, 3.03, 3.53]
    assert all(r["seed"] == 3 for r in res["references"])
    # TINY: d_model 32, 2 heads -> d_head 16 -> 2 * 16 * 16 floats of matrix state per layer
    assert res["references"][1]["state"]["floats_per_layer"] == 512
    assert res["references"][0]["state"]["floats_per_layer"] is None
    # the paired test is SV vs matched window only: means (2.03 + 2.04) / 2, (2.56 + 2.58) / 2
    assert res["tests"]["mean_sv"] == pytest.approx(2.035)
    assert res["tests"]["mean_swa"] == pytest.approx(2.57)
    assert set(REFERENCE_VARIANTS) == {"deltanet", "linear", "softmax"}
    # without references: no extra runs, empty list
    calls.clear()
    res0 = run_comparison(TINY, [3], _text(), runner=_fake_runner(calls), progress=False)
    assert res0["references"] == [] and len(calls) == 2


def test_unknown_reference_fails_before_training():
    calls = []
    with pytest.raises(LMStudyError, match="mamba"):
        run_comparison(TINY, [0], _text(), runner=_fake_runner(calls), references=["mamba"])
    assert calls == []


def test_tiny_references_train_for_real():
    res = run_comparison(TINY, [0], _text(), progress=False,
                         references=["deltanet", "linear", "softmax"])
    assert [r["variant"] for r in res["references"]] == ["deltanet", "linear", "softmax"]
    for r in res["references"]:
        assert 0.5 < r["best_val_bpb"] < 9.0 and len(r["curve"]) == 2  # evals at steps 3 and 6
        assert r["params_non_embedding"] > 0
    # same backbone: softmax and linear have identical parameter counts; DeltaNet adds its beta
    p = {r["variant"]: r["params_non_embedding"] for r in res["references"]}
    assert p["softmax"] == p["linear"] and p["deltanet"] == p["softmax"] + TINY.n_layers * (
        TINY.d_model * TINY.n_heads + TINY.n_heads)
    json.dumps(res)


def test_cli_references_option_parsing():
    import argparse

    from pipelines.flows.language_model import add_cli

    parser = argparse.ArgumentParser()
    add_cli(parser.add_subparsers())
    assert parser.parse_args(["lm"]).references is None
    assert parser.parse_args(["lm", "--references"]).references == []  # -> all three in _cli
    assert parser.parse_args(["lm", "--references", "linear", "softmax"]).references == [
        "linear", "softmax"]
    with pytest.raises(SystemExit):
        parser.parse_args(["lm", "--references", "lstm"])


def _check_progress_lines(lines, res):
    """The tiny run's progress: one line per run, per 2 steps and per eval, with the eval metric."""
    runs = [ln for ln in lines if ln.startswith("lm: run ")]
    assert runs[0].startswith("lm: run 1/4: SV hybrid, seed 0") and runs[1].startswith("lm: run 2/4: matched")
    assert len(runs) == 4
    for variant in ("sv_hybrid", "sliding"):
        steps = [ln for ln in lines if ln.startswith(f"lm {variant} seed 0: step ")]
        # TINY: log every 2 steps, evaluate at steps 3 and 6 -> lines at steps 2, 3, 4, 6
        assert [int(ln.split("step ")[1].split("/")[0]) for ln in steps] == [2, 3, 4, 6]
        assert all("loss " in ln and "elapsed " in ln and "ETA " in ln for ln in steps)
        evals = [ln for ln in steps if "bits/byte" in ln]
        assert len(evals) == 2 and evals[-1].endswith("ETA 0s")
        # the printed eval metric is the recorded curve
        curve = res["curves"]["0"]["sv" if variant == "sv_hybrid" else "swa"]
        assert [f"val {c['val_bpb']:.3f}" in e for c, e in zip(curve, evals)] == [True, True]


def test_no_progress_prints_nothing(capsys):
    from dataclasses import replace

    from evaluation.studies.language_model import train_run

    train, val = split_corpus(_text(), TINY.val_frac, TINY.block)
    train_run(replace(TINY, steps=2, eval_interval=1, log_every=1), "sliding", 0, train, val, 8, progress=False)
    assert capsys.readouterr().out == ""  # progress=False: no line at all


def test_protocols_and_the_recorded_label():
    from evaluation.studies.language_model import CPU, PROTOCOLS, LMConfig
    from evaluation.studies.language_model_result import study_result

    assert PROTOCOLS["seed"][0] == LMConfig() and PROTOCOLS["seed"][1] == [0, 1, 2]
    assert LMConfig().steps == 2000 and CPU.steps < 200 and PROTOCOLS["cpu"][0] is CPU
    res = run_comparison(TINY, [0], _text(), runner=_fake_runner([]), progress=False)
    for protocol, labelled in (("tiny", True), ("cpu", True), ("seed", False), ("paper", False),
                              ("cpu+custom", True)):
        study = study_result({**res, "protocol": protocol}, "x")
        assert study["metrics"]["protocol"] == protocol and study["config"]["protocol"] == protocol
        assert ("not the seed's" in study["title"]) is labelled
        assert study["notes"].startswith(f"Protocol: {PROTOCOLS[protocol.split('+')[0]][2]}")


def test_cli_protocol_option():
    import argparse

    from pipelines.flows.language_model import DEFAULT_PROTOCOL, add_cli

    parser = argparse.ArgumentParser()
    add_cli(parser.add_subparsers())
    assert DEFAULT_PROTOCOL == "cpu" and parser.parse_args(["lm"]).protocol == "cpu"
    assert parser.parse_args(["lm", "--protocol", "seed"]).protocol == "seed"
    with pytest.raises(SystemExit):
        parser.parse_args(["lm", "--protocol", "fast"])


def test_resume_reuses_finished_runs_and_retrains_on_another_config(tmp_path):
    from dataclasses import replace

    calls = []
    first = run_comparison(TINY, [0, 1], _text(), runner=_fake_runner(calls), progress=False,
                           references=["linear"], resume_dir=tmp_path / "runs")
    assert len(calls) == 5 and first["runs_loaded_from_resume"] == 0
    assert len(list((tmp_path / "runs").glob("*.json"))) == 5
    calls.clear()
    again = run_comparison(TINY, [0, 1], _text(), runner=_fake_runner(calls), progress=False,
                           references=["linear"], resume_dir=tmp_path / "runs")
    assert calls == [] and again["runs_loaded_from_resume"] == 5
    assert again["per_seed"] == first["per_seed"] and again["tests"] == first["tests"]
    # one more seed trains only the new pair
    run_comparison(TINY, [0, 1, 2], _text(), runner=_fake_runner(calls), progress=False,
                   resume_dir=tmp_path / "runs")
    assert [c[:2] for c in calls] == [("sv_hybrid", 2), ("sliding", 2)]
    # another configuration or another corpus: nothing is reused
    calls.clear()
    run_comparison(replace(TINY, steps=7), [0], _text(), runner=_fake_runner(calls), progress=False,
                   resume_dir=tmp_path / "runs")
    assert len(calls) == 2
    calls.clear()
    run_comparison(TINY, [0], _text(seed=5), runner=_fake_runner(calls), progress=False,
                   resume_dir=tmp_path / "runs")
    assert len(calls) == 2
    # a corrupt run file is retrained, not trusted
    calls.clear()
    for f in (tmp_path / "runs").glob("sv_hybrid-seed0*.json"):
        f.write_text("{not json")
    run_comparison(TINY, [0], _text(seed=5), runner=_fake_runner(calls), progress=False,
                   resume_dir=tmp_path / "runs")
    assert calls[0][:2] == ("sv_hybrid", 0)


def test_paired_effect_size_and_intervals_hand_values():
    sv, swa = [2.0, 2.1, 2.2, 2.0], [2.3, 2.3, 2.5, 2.4]
    res = paired_tests(sv, swa)
    d = [0.3, 0.2, 0.3, 0.4]
    m = sum(d) / 4
    sd = math.sqrt(sum((x - m) ** 2 for x in d) / 3)
    assert res["d_z"] == pytest.approx(m / sd)
    half = 3.182446305284263 * sd / 2  # t(0.975, 3) * sd / sqrt(4)
    assert res["diff_ci95"] == pytest.approx([m - half, m + half])
    assert res["seeds_favouring_sv"] == 4
    rel = [x / y for x, y in zip(d, swa)]
    assert res["mean_rel_improvement"] == pytest.approx(sum(rel) / 4)
    assert res["rel_improvement_ci95"][0] < sum(rel) / 4 < res["rel_improvement_ci95"][1]


def test_paper_protocol_is_the_32m_model_with_seven_seeds():
    from evaluation.studies.language_model import PROTOCOLS, LMConfig

    cfg, seeds, _ = PROTOCOLS["paper"]
    assert seeds == list(range(7))
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.block, cfg.batch) == (256, 4, 4, 256, 16)
    assert (cfg.chunk, cfg.C, cfg.sigma, cfg.fista_iters) == (64, 0.25, 2.0, 80)
    assert cfg == LMConfig()


def test_unavailable_device_and_bad_threads_fail_before_training(tmp_path):
    from pipelines.flows.language_model import LMSettings, language_model_flow

    if not torch.cuda.is_available():
        with pytest.raises(LMStudyError, match="not available"):
            language_model_flow.fn(corpus=str(tmp_path / "none"), settings=LMSettings(protocol="tiny", device="cuda"),
                                   out=str(tmp_path / "r.json"))
    with pytest.raises(LMStudyError, match="threads"):
        language_model_flow.fn(corpus=str(tmp_path / "none"), settings=LMSettings(protocol="tiny", threads=0),
                               out=str(tmp_path / "r.json"))
    assert not (tmp_path / "r.json").exists()
