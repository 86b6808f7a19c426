"""A witness server for the tests: on 127.0.0.1, a free port, in a thread, stopped by the test
that started it (``tests/test_witness.py``, ``tests/test_witness_log.py``, the tamper table)."""
from __future__ import annotations

import http.client
import threading
from pathlib import Path

from pipelines.receipts import witness
from pipelines.receipts.c2sp import Vkey


class Served:
    """A witness server on 127.0.0.1 (a free port) in a thread; ``stop()`` shuts it down."""

    def __init__(self, d: Path, logs: list[Vkey], port: int = 0, **kw):
        self.srv = witness.make_server(d, logs, "127.0.0.1", port, quiet=True, **kw)
        self.port = self.srv.server_address[1]
        self.thread = threading.Thread(target=self.srv.serve_forever, daemon=True)
        self.thread.start()

    def post(self, text: str, path: str = "/add-checkpoint", method: str = "POST") -> tuple[int, str, str]:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            c.request(method, path, body=text.encode() if method == "POST" else None)
            r = c.getresponse()
            return r.status, r.getheader("Content-Type"), r.read().decode()
        finally:
            c.close()

    def stop(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()
        self.thread.join(5)
