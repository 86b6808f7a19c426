"""``forgetful report [--runs DIR] [--out FILE]``: re-render the HTML report from the result files
stored under a runs folder (``dashboards.report``), for example after ``forgetful forget`` or a
single study command, without rerunning anything. Reads the result JSON only (aggregates), writes
the report atomically (on any error the old report is left as it was) and starts no Prefect
server. The same as ``python -m dashboards.report --runs DIR --out FILE``.
"""
from __future__ import annotations

from pathlib import Path

from pipelines import jsonout
from pipelines.runtime import runner


@runner.cli_errors
def _main(args) -> int:
    from dashboards.report import load_results, write_report

    runs = Path(args.runs)
    out = Path(args.out) if args.out else runs / "report.html"
    path = write_report(runs, out, title=args.title)
    results, skipped = load_results(runs)
    studies = sorted({r.payload["study"] for r in results})
    print(f"wrote {path}: {len(results)} result file(s) from {runs}"
          + (f" ({', '.join(studies)})" if studies else " (none yet: run forgetful run-all or a study command)"))
    jsonout.emit(args, {"report": str(path), "runs": str(runs), "results": len(results), "studies": studies,
                        "skipped": skipped})
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("report", help="re-render the HTML report from the stored results (no Prefect server)",
                       description=__doc__)
    p.add_argument("--runs", default="runs", metavar="DIR",
                   help="runs folder searched recursively for result JSON (default: %(default)s)")
    p.add_argument("--out", default=None, metavar="FILE", help="HTML report (default: <runs>/report.html)")
    p.add_argument("--title", default="forgetful — study report", help="page title (default: %(default)s)")
    jsonout.add_json_arg(p)  # the report path and what it was rendered from
    p.set_defaults(func=_main)
