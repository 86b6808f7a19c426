"""The command lines of ``forgetful retention`` and ``forgetful heldout-spo2``: options, the
study's settings (built and validated here, once: :class:`pipelines.settings.RetentionSettings`),
the run through the command's warehouse session, the printed summary.

The flows and the study live in :mod:`pipelines.flows.clinical_retention`; with ``--events FILE``
either command studies your own event (:mod:`cohort.events`) with its channels withheld from every
selector.
"""
from __future__ import annotations

from dashboards.seed_figures import seed_line
from pipelines import jsonout
from pipelines.flows import clinical_retention
from pipelines.flows.clinical_retention import heldout_flow, retention_flow
from pipelines.runtime import runner, scaleout
from pipelines.settings import COUNT, COUNT0, NU, POSITIVE, SEED, RetentionSettings, event_file


def _print(res: dict, args=None) -> None:
    m = res["metrics"]
    print(f"{res['study']}: {m['n_stays_included']} stays with an event (of {m['n_stays']}), "
          f"keys {m['key_dim']}-d, mean budget {m['mean_budget_fraction']:.3f}")
    for p, v in m["retention"].items():
        print(f"  {p + (' (expectation k/n)' if p == 'random' else ''):<8} retention {v:.3f}")
    for k, v in m.items():
        if k.startswith("diff_sv_minus_"):
            print(f"  SV - {k[14:]:<8} {v['mean']:+.3f} [{v['low']:.3f}, {v['high']:.3f}]")
    if m.get("low_power"):
        print(f"  {m['low_power_reason']}")
    a = m.get("refit_audit") or {}
    if a.get("stays_audited"):
        print(f"  refit audit on {a['stays_audited']} stays: max |Δscore| {a['score_dev_max']:.2g}, partitions equal "
              f"on {a['partition_exact_matches']}/{a['stays_audited']}")
    print("  " + seed_line(res["study"], res["data"]))
    print(f"  runtime {res['runtime_s']:.1f}s")
    jsonout.emit(args, res)


def settings_of(args, heldout: bool) -> RetentionSettings:
    """The command line's study settings (validated here, once)."""
    return RetentionSettings(heldout=heldout, event=args.events, nu=args.nu, sigma=args.sigma, seed=args.seed,
                             n_boot=args.n_boot, stays=args.stays, stays_per_task=args.stays_per_task,
                             audit_stays=args.audit_stays,
                             sensitivity_stays=0 if args.no_sensitivity else args.sensitivity_stays,
                             persist_gates=not getattr(args, "no_persist", False))


def _main_retention(args) -> int:
    _print(runner.run_cli_flow(retention_flow, args, warehouse=args.warehouse, runs_dir=args.runs,
                               settings=settings_of(args, heldout=False), progress=not args.no_progress), args)
    return 0


def _main_heldout(args) -> int:
    _print(runner.run_cli_flow(heldout_flow, args, warehouse=args.warehouse, runs_dir=args.runs,
                               settings=settings_of(args, heldout=True), progress=not args.no_progress), args)
    return 0


def _common(p) -> None:
    p.add_argument("--nu", type=NU, default=0.3, help="SVDD ν of each stay's gate, in (0, 1] (default %(default)s)")
    p.add_argument("--sigma", type=POSITIVE, default=3.0, help="RBF kernel width σ > 0 (default %(default)s)")
    p.add_argument("--seed", type=SEED, default=0, help="bootstrap and stay-sample seed (default 0)")
    p.add_argument("--n-boot", type=COUNT, default=10_000, help="stay bootstrap resamples (default %(default)s)")
    p.add_argument("--stays", type=COUNT, default=None, metavar="N",
                   help="run on a deterministic sample of N eligible stays (seeded hash order, stable under "
                        "rebuilds; default: every eligible stay)")
    p.add_argument("--stays-per-task", type=COUNT, default=None,
                   help=f"stays per task (default: sized from the measured cost: {scaleout.sizing_text()})")
    p.add_argument("--audit-stays", type=COUNT0, default=50, metavar="N",
                   help="independent refit audit of the certified solve on the first N stays with an event in the "
                        "seeded order (default %(default)s; 0: off)")
    p.add_argument("--sensitivity-stays", type=COUNT0, default=200, metavar="N",
                   help="ν × σ sensitivity table on the first N stays with an event in the seeded order "
                        "(default %(default)s)")
    p.add_argument("--events", type=event_file, default=None, metavar="FILE",
                   help="your own event, as ACES-style predicates in YAML (cohort.events; e.g. a predicate on "
                        "HOURLY_MEAN//HR//bpm with value_min 130), in place of the built-in one; its channels are "
                        "withheld from every selector (the held-out rule), and no gates are stored")
    p.add_argument("--no-sensitivity", action="store_true", help="skip the sensitivity table")
    runner.add_common_args(p)
    jsonout.add_json_arg(p)


def add_cli(sub) -> None:
    p = sub.add_parser("retention", help="certified event-hour retention per ICU stay (SV vs density/recency/random)",
                       description=clinical_retention.__doc__)
    _common(p)
    p.add_argument("--no-persist", action="store_true", help="do not store the gates in the warehouse")
    p.set_defaults(func=_main_retention)
    q = sub.add_parser("heldout-spo2", help="held-out SpO2 control (SpO2 < 90 label, 5-d keys without SpO2)",
                       description=clinical_retention.__doc__)
    _common(q)
    q.set_defaults(func=_main_heldout)
