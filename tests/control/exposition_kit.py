"""A real engine's metrics exposition (`benchmarks/operator_scale.py`'s `engine_exposition`, from the engine's
own `ServerMetrics`) and an HTTP server that serves it, for the tests of what the control loop reads."""
from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from operator_scale import engine_exposition as _exposition  # noqa: E402  (benchmarks/operator_scale.py)


def engine_exposition(rounds: int = 1) -> str:
    """What a real engine serves after `rounds` steps at every batch-size bucket, speculating and not."""
    return _exposition(rounds).decode()


@contextmanager
def serving(text: str) -> Iterator[str]:
    """An HTTP server answering `/metrics` with `text`; yields its base URL."""
    body = text.encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
