"""``forgetful gate-demo``: admit a stream, certify and evict reserve keys, forget with verification."""
from __future__ import annotations

import numpy as np

from pipelines import jsonout


def run_gate_demo(n: int = 120, d: int = 6, nu: float = 0.4, sigma: float = 2.0, seed: int = 0) -> dict:
    from sv_core import Gate, calibrate_C

    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    C = calibrate_C(nu, n)
    g = Gate(C=C, sigma=sigma)
    g.admit(X)
    part = {k: len(v) for k, v in g.partition().items()}
    active = g.support_ids()
    receipt = g.forget(int(active[0]), verify=True)
    cert = g.evict_reserve()
    return {"C": C, "n": n, "partition": part, "receipt": receipt.to_dict(), "certificate": cert.to_dict(),
            "kkt_residual": g.kkt_residual()["max"]}


def _cli(args) -> int:
    out = run_gate_demo(args.n, args.d, args.nu, args.sigma, args.seed)
    print(f"gate: n={out['n']} C={out['C']:.5f} partition={out['partition']}")
    r = out["receipt"]
    print(f"forgot token {r['token_id']} ({r['status_before']}, alpha={r['alpha_before']:.4g}) in "
          f"{1e3 * r['elapsed_s']:.2f} ms, {r['path_events']} path events; max |Δ gate score| vs refit "
          f"{r['verification']['max_abs_score_dev']:.2e}, KKT residual {r['verification']['kkt_residual']:.1e}")
    c = out["certificate"]
    print(f"evicted {len(c['evicted'])} certified-reserve tokens; measured max |Δ score| "
          f"{c['max_abs_score_change']:.1e}, max |Δ readout weight| {c['max_abs_weight_change']:.1e}")
    jsonout.emit(args, out)
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("gate-demo", help="admit a stream, certify, evict, forget with verification")
    p.add_argument("--n", type=int, default=120, help="stream length: keys admitted (default %(default)s)")
    p.add_argument("--d", type=int, default=6, help="key dimension (default %(default)s)")
    p.add_argument("--nu", type=float, default=0.4, help="SVDD ν; sets C = 1/(ν·n) once (default %(default)s)")
    p.add_argument("--sigma", type=float, default=2.0, help="RBF kernel width σ (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the stream (default %(default)s)")
    jsonout.add_json_arg(p)  # the receipt, certificate and partition
    p.set_defaults(func=_cli)
