"""A real engine's metrics exposition (the engine's own `ServerMetrics`), for the tests of what the control
loop reads of it."""
from __future__ import annotations

import itertools
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

from specfleet.engine.server.metrics import ServerMetrics
from specfleet.engine.stats import StepRecord


def engine_exposition(rounds: int = 1) -> str:
    """What a real engine serves after `rounds` steps at every batch-size bucket, speculating and not, and a
    request."""
    metrics = ServerMetrics("m")
    for _, n, speculating in itertools.product(range(rounds), (1, 2, 3, 5, 9, 17, 33, 65, 129), (True, False)):
        metrics.observe_step(StepRecord(0.002 * n, n, 2 * n, n, 0, speculating))
    metrics.first_token(0.2)
    metrics.inter_token(0.02, 10)
    metrics.finished("stop", 1.0)
    return metrics.render().decode()


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
