"""``forgetful build-cohort``: build the hourly vital-sign warehouse as a Prefect flow.

Sources: ``demo`` (default; the real MIMIC-IV demo as CLIF parquet, from the cache filled by
``python -m cohort.demo_data fetch``), ``mimic --root DIR`` (MIMIC-IV v3.1 native files),
``clif --root DIR``, ``meds --root DIR [--meds-codes FILE]`` (a MEDS v0.4 dataset, e.g. from
MIMIC_IV_MEDS or ``forgetful export --format meds``; :mod:`cohort.meds`),
``synthetic --stays N --seed S`` (generated MIMIC-IV-layout files).
Writes ``<runs>/cohort/result.json`` (the funnel, aggregates only).
"""
from __future__ import annotations

import time
from pathlib import Path

from prefect import flow, task

from pipelines import jsonout
from pipelines.runtime import runner
from pipelines.settings import COUNT, HOURS, SEED, CohortSettings
from pipelines.store import warehouse as wh


@task(name="generate-synthetic",
      retries=2, retry_delay_seconds=runner.IO_RETRY_DELAYS, retry_condition_fn=runner.retry_transient_io)
def generate_synthetic(out_dir: str, stays: int, seed: int) -> str:
    from cohort.synthetic import generate

    out = Path(out_dir)
    marker = out / "synthetic_manifest.json"
    if not marker.is_file():  # generation is deterministic per (stays, seed): reuse the files
        generate(out, stays=stays, seed=seed, fmt="parquet")
    return str(out)


@task(name="build-warehouse",
      retries=2, retry_delay_seconds=runner.IO_RETRY_DELAYS, retry_condition_fn=runner.retry_transient_io)
def build_task(source: str, root: str | None, warehouse: str, settings: CohortSettings = CohortSettings(),
               progress: bool = False, ledger_dir: str | None = None, runs_dir: str | None = None,
               source_key: str | None = None) -> dict:
    """Build with the forget registry applied at scan time — the warehouse's own log and every
    other log this configuration keeps for the same source (``source_key``, default from
    ``source`` and ``root``: :mod:`pipelines.store.registries`), so a second warehouse of the same
    data admits no forgotten patient; a listed log that cannot be read refuses the build. The
    new warehouse records the ledger head it reflects and its source, and keeps the runs and
    export folders registered with the old one (a later forget still reaches an export written
    before the rebuild)."""
    import duckdb

    from cohort.build import build_warehouse
    from pipelines.store import export_registry, registries
    from pipelines.store.safe_io import storage_errors
    from pipelines.store.warehouse import Warehouse, put_meta, read_meta

    key = source_key or registries.source_key(source, root)
    with Warehouse.open(warehouse, write=True, must_exist=False, ledger_dir=ledger_dir, reconcile=False,
                        source=key) as w:
        registered = w.runs_registry()  # carried into the rebuilt file
        old_meta = read_meta(w.path) if w.path.is_file() else {}
        exports = {k: old_meta[k] for k in export_registry.META_KEYS if old_meta.get(k)}
        w.bind_registry()  # a log that holds receipts (e.g. from before sources were recorded) joins its source
        exclusion = w.exclusion()  # every registry of the source, verified, before anything is written
        with storage_errors("build-cohort: building the warehouse",
                            "the previous warehouse is unchanged (a build writes a new file and swaps it in only "
                            "when complete) and its temporary files were removed; rerun once the disk allows"):
            s = build_warehouse(source, root, warehouse, min_hours=settings.min_hours, sample=settings.sample,
                                seed=settings.seed, memory_limit=settings.memory_limit, progress=progress,
                                exclude_subjects=exclusion, meds_codes=settings.meds_codes)
        con = duckdb.connect(str(w.path))
        try:
            for k, v in {**w.ledger_meta(), **exports}.items():
                put_meta(con, k, v)
        finally:
            con.close()
        w.restore_runs_registry(registered)
        if runs_dir:
            w.register_runs_dir(runs_dir)
    return s.to_json()


def data_kind_of(source: str, root: str | None) -> str:
    """What the data *is*, for the report's badge: the demo, synthetic (the generator's own files,
    recognised by its manifest, whichever adapter reads them), or a user's MIMIC-IV / CLIF root."""
    if source == "demo":
        return "demo"
    if source == "synthetic" or (root and (Path(root) / "synthetic_manifest.json").is_file()):
        return "synthetic"
    if source == "meds" and root:  # this project's own MEDS export names the data it came from
        from cohort.meds import read_dataset_metadata

        meta = read_dataset_metadata(root)
        if meta.get("etl_name") == "forgetful":
            for kind in ("demo", "synthetic", "clif", "mimic"):
                if meta.get("dataset_name") == f"forgetful {kind} cohort":
                    return kind
    return "clif" if source == "clif" else "mimic"


@flow(name="build-cohort", log_prints=True)
def build_cohort_flow(source: str = "demo", root: str | None = None, warehouse: str = "runs/warehouse.duckdb",
                      runs_dir: str = "runs", settings: CohortSettings = CohortSettings(), progress: bool = True,
                      ledger_dir: str | None = None) -> dict:
    """Build the warehouse; returns the build summary (counts, content hash, seconds)."""
    t0 = time.perf_counter()
    kind, stays, seed = source, settings.stays, settings.seed
    if source == "demo":
        from cohort.demo_data import ensure_demo

        root = str(ensure_demo(root, fetch=settings.fetch))
    from pipelines.store.registries import source_key

    key = source_key(source, root, stays=stays, seed=seed)  # the data, whichever folder it is generated into
    if source == "synthetic":
        gen_dir = Path(warehouse).resolve().parent / f"synthetic_{stays}_seed{seed}"
        root = generate_synthetic(str(gen_dir / "mimic"), stays, seed)
        source = "mimic"
    summary = build_task(source, root, warehouse, settings, progress, ledger_dir, runs_dir, key)
    wh.set_data_kind(warehouse, data_kind_of(kind, root))
    funnel = summary["funnel"]
    result = {
        "study": "cohort",
        "title": f"Cohort funnel ({kind})",
        "data": wh.data_kind(warehouse),
        "runtime_s": time.perf_counter() - t0,
        "seed_figure": {},
        "metrics": {"n_stays": summary["n_stays"], "n_tokens": summary["n_rows"], "min_hours": settings.min_hours,
                    "build_seconds": summary["seconds"]},
        "tables": [{"title": "funnel", "columns": ["step", "stays", "rows"],
                    "rows": [[s, a, b] for s, a, b in funnel]}],
        "figures": [{"kind": "funnel", "title": "cohort funnel (stays)",
                     "stages": [{"label": s, "count": a} for s, a, _ in funnel]}],
        "config": {"source": kind, "seed": seed, "sample": settings.sample,
                   "stays": stays if kind == "synthetic" else None,
                   "content_hash": summary["content_hash"]},
    }
    runner.write_study_result(result, runs_dir)
    return summary


def settings_of(args) -> CohortSettings:
    """The command line's build settings (validated here, once)."""
    return CohortSettings(stays=args.stays, seed=args.seed, min_hours=args.min_hours, sample=args.sample,
                          memory_limit=args.memory_limit, meds_codes=args.meds_codes, fetch=args.fetch)


def _main(args) -> int:
    import json

    s = runner.run_cli_flow(build_cohort_flow, args, must_exist=False, ledger_dir=args.ledger,
                            source=args.source, root=args.root, warehouse=args.warehouse, runs_dir=args.runs,
                            settings=settings_of(args), progress=not args.no_progress)
    out = {"warehouse": s["warehouse"], "n_stays": s["n_stays"], "n_rows": s["n_rows"],
           "content_hash": s["content_hash"], "seconds": round(s["seconds"], 2),
           "cpu_seconds": round(s.get("cpu_seconds", 0.0), 2), "cpu_phases": s.get("cpu_phases", {})}
    print(json.dumps(out))
    jsonout.emit(args, out)
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("build-cohort", help="build the hourly vital-sign warehouse (default: the real MIMIC-IV demo)",
                       description=__doc__)
    p.add_argument("--source", choices=["demo", "mimic", "clif", "meds", "synthetic"], default="demo",
                   help="data source: the MIMIC-IV demo, your MIMIC-IV, CLIF or MEDS root, or generated data "
                        "(default %(default)s)")
    p.add_argument("--root", default=None, help="source folder (mimic/clif/meds; demo: cache folder, optional)")
    p.add_argument("--meds-codes", default=None, metavar="FILE",
                   help="meds: JSON map of MEDS codes to vitals (default: MIMIC_IV_MEDS chartevents codes of the "
                        "pinned itemids, and this project's export codes; see docs/MEDS.md)")
    p.add_argument("--stays", type=COUNT, default=1500, help="synthetic: number of generated stays (default 1500)")
    p.add_argument("--seed", type=SEED, default=0, help="split / sample / synthetic-data seed (default %(default)s)")
    p.add_argument("--min-hours", type=HOURS, default=48,
                   help="minimum ICU length of stay in hours (default %(default)s)")
    p.add_argument("--sample", type=COUNT, default=None, help="keep a deterministic sample of N eligible stays")
    p.add_argument("--memory-limit", default="4GB", help="DuckDB memory limit of the build (default %(default)s)")
    p.add_argument("--fetch", action="store_true", help="demo: fetch the demo wheel first if it is not cached")
    runner.add_common_args(p)
    jsonout.add_json_arg(p)
    p.set_defaults(func=_main)
