"""``forgetful witness``: run a transparency-log witness for a receipt log (https://c2sp.org/tlog-witness).

* ``init --dir D --name NAME`` makes the witness's Ed25519 key in folder D (owner-only; an
  existing key is never replaced) and prints its verifier key (cosignature/v1, type 0x04): give
  it to the log's operator (``forgetful receipts witness add --url URL --vkey WVKEY``) and to
  auditors (``forgetful receipts verify --witness WVKEY``);
* ``serve --dir D --log-vkey VKEY --host 127.0.0.1 --port P`` answers ``POST /add-checkpoint``
  for the logs whose verifier keys it is given (``forgetful receipts public-key --format vkey``),
  cosigning only checkpoints consistent with the largest one it cosigned before, until stopped
  (Ctrl-C). It binds loopback by default; a witness that logs elsewhere reach is put behind TLS
  (a reverse proxy, or the certificate options of ``serve``; docs/RECEIPTS.md).

Exit 0 done, 2 usage, 3 a witness error (one typed line).
"""
from __future__ import annotations

import json
import sys

from pipelines import jsonout
from pipelines.runtime import runner


@runner.cli_errors
def _init(args) -> int:
    from pipelines.receipts import witness

    v = witness.init(args.dir, args.name)
    out = {"witness": v.name, "dir": args.dir, "vkey": v.text()}
    if args.out:
        from sv_core.jsonfile import atomic_write_text

        atomic_write_text(args.out, v.text() + "\n")
    print(f"witness {v.name} created in {args.dir}; its verifier key:", file=sys.stderr)
    print(v.text())
    jsonout.emit(args, out)
    return 0


@runner.cli_errors
def _serve(args) -> int:
    from pipelines.receipts import witness

    if bool(args.tls_cert) != bool(args.tls_key):
        print("forgetful witness serve: error: --tls-cert and --tls-key go together", file=sys.stderr)
        return runner.EXIT_USAGE
    from pipelines.receipts.c2sp import ED25519
    from pipelines.receipts.checkpoints import read_vkey

    logs = [read_vkey(v, ED25519) for v in args.log_vkey]
    tls = (args.tls_cert, args.tls_key) if args.tls_cert else None
    srv = witness.make_server(args.dir, logs, args.host, args.port, args.prefix, tls=tls, quiet=args.quiet)
    host, port = srv.server_address[:2]
    url = f"{'https' if tls else 'http'}://{host}:{port}{srv.prefix}"
    if tls is None and host not in ("127.0.0.1", "::1", "localhost"):
        print(f"[witness] WARNING: listening on {host} without TLS: put it behind TLS (docs/RECEIPTS.md)",
              file=sys.stderr)
    print(f"[witness] {srv.cosigner.name} serving {url}/add-checkpoint for {', '.join(v.name for v in logs)}; "
          f"verifier key {srv.cosigner.vkey.text()}", file=sys.stderr, flush=True)
    print(json.dumps({"url": url, "vkey": srv.cosigner.vkey.text()}), flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("witness", help="run a transparency-log witness that cosigns a receipt log's checkpoints",
                       description=__doc__)
    ws = p.add_subparsers(dest="witness_command", metavar="{init,serve}")
    ws.required = True
    i = ws.add_parser("init", help="make a witness key in a folder and print its verifier key")
    i.add_argument("--dir", required=True, metavar="D", help="the witness's folder (created owner-only)")
    i.add_argument("--name", required=True, metavar="NAME",
                   help="the cosigner name, e.g. witness.example.org/forgetful (no spaces, no '+')")
    i.add_argument("--out", default=None, metavar="FILE", help="also write the verifier key to this file")
    s = ws.add_parser("serve", help="answer POST /add-checkpoint (tlog-witness) until stopped")
    s.add_argument("--dir", required=True, metavar="D", help="a folder made by `forgetful witness init`")
    s.add_argument("--log-vkey", required=True, action="append", metavar="VKEY",
                   help="a log's verifier key (text or file; `forgetful receipts public-key --format vkey`); repeat "
                        "for several logs")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s, loopback only)")
    s.add_argument("--port", type=int, default=0, help="port to bind (default: a free one, printed)")
    s.add_argument("--prefix", default="", help="submission prefix before /add-checkpoint (default: none)")
    s.add_argument("--tls-cert", default=None, metavar="FILE", help="serve HTTPS with this certificate chain (PEM)")
    s.add_argument("--tls-key", default=None, metavar="FILE", help="the certificate's private key (PEM)")
    s.add_argument("--quiet", action="store_true", help="no line per request on stderr")
    for q, fn in ((i, _init), (s, _serve)):
        jsonout.add_json_arg(q)
        q.set_defaults(func=fn)
