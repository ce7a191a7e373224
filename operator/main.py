"""Run the operator: kopf embedded in this process (`specfleet operator run`).

Standalone kopf (no peering objects), for one namespace, several, or the whole cluster. Credentials come
from the in-cluster service account or KUBECONFIG.

With leader election (`--leader-elect`, `leader.py`) the process first follows: it answers its liveness
endpoint itself ("leader": false) and tries the Lease every retry period. kopf, and with it every handler
and the control loop, starts only once this process holds the Lease. A leader that cannot renew within
the renew deadline exits at once (Kubernetes restarts it as a follower); on SIGTERM/SIGINT kopf stops
first and then the Lease is released, so a follower takes over at its next attempt.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

from specfleet.operator import leader

log = logging.getLogger("specfleet.operator.main")
EXIT_LEADERSHIP_LOST = 3


def identity_from_environment() -> str:
    """The pod's name (downward API `POD_NAME`), else `hostname_pid`."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}_{os.getpid()}"


def lease_namespace_from_environment(given: str | None) -> str:
    """A namespace given on the command line, else the pod's own (`POD_NAMESPACE`), else specfleet-system."""
    return given or os.environ.get("POD_NAMESPACE") or leader.DEFAULT_LEASE_NAMESPACE


def run(namespaces: list[str] | None = None, clusterwide: bool = False, liveness: str | None = None,
        verbose: bool = False, election: leader.ElectionConfig | None = None) -> None:
    """Block running the operator until SIGINT/SIGTERM (or, when elected, until leadership is lost)."""
    import kopf

    from specfleet.operator import handlers  # noqa: F401  (registers the handlers)

    if not clusterwide and not namespaces:
        raise ValueError("give namespaces or clusterwide=True")
    from specfleet.operator.control import telemetry

    kopf.configure(verbose=verbose)
    if not verbose:     # one line per scrape of every pod drowns kopf's own messages
        for name in ("httpx", "httpcore"):
            logging.getLogger(name).setLevel(logging.WARNING)
        logging.getLogger("kopf.objects").addFilter(without_handler_successes)
    telemetry.serve_from_environment()

    def run_kopf() -> None:
        kopf.run(standalone=True, clusterwide=clusterwide, namespaces=namespaces or [], liveness_endpoint=liveness)

    if election is None:
        telemetry.LEADER.set(1)
        run_kopf()
        return
    run_elected(election, leader.KubeLeases.from_environment(election), liveness, run_kopf, telemetry.LEADER)


def without_handler_successes(record: logging.LogRecord) -> bool:
    """Drops kopf's "Handler '...' succeeded." lines: one per watch event per handler, tens of thousands in
    a burst of creates, and the larger part of what the event loop spent on logging. What kopf says once
    per create, update or resume ("Creation is processed: 1 succeeded; 0 failed.") and every warning stay."""
    message = record.getMessage()
    return not (record.levelno == logging.INFO and message.startswith("Handler '") and message.endswith(" succeeded."))


def run_elected(config: leader.ElectionConfig, client: leader.LeaseClient, liveness: str | None, run_kopf,
                gauge) -> None:
    """Follow until elected, then run kopf while renewing; release the Lease when kopf returns."""
    import kopf

    elector = leader.Elector(config, client)
    gauge.set(0)
    stopping = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    health = FollowerHealth(liveness, elector) if liveness else None
    log.info("leader election: %s waits for lease %s/%s (duration %d s, renew deadline %g s, retry %g s)",
             config.identity, config.namespace, config.name, config.lease_duration_s, config.renew_deadline_s,
             config.retry_period_s)
    try:
        elected = leader.follow(elector, sleep=stopping.wait, stopping=stopping.is_set)
    except KeyboardInterrupt:
        elected = False
    finally:
        if health:
            health.close()
        signal.signal(signal.SIGTERM, previous)
    if not elected or stopping.is_set():
        elector.release()
        return
    log.info("leader election: %s now leads (lease %s/%s, transitions %d)", config.identity, config.namespace,
             config.name, elector.observed.transitions if elector.observed else 0)
    gauge.set(1)

    @kopf.on.probe(id="leader")
    def _leading(**_) -> bool:
        return elector.leading

    renewing = leader.Leadership(elector, lost_leadership).start()
    try:
        run_kopf()
    finally:
        renewing.stop(timeout=config.renew_deadline_s)
        gauge.set(0)
        if elector.release():
            log.info("leader election: %s released lease %s/%s", config.identity, config.namespace, config.name)


def lost_leadership(reason: str) -> None:
    """Stop acting at once: the process exits without cleanup, so no handler or control step runs on."""
    log.critical("leader election: leadership lost (%s); exiting so that only one operator acts", reason)
    for handler in logging.getLogger().handlers + log.handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(EXIT_LEADERSHIP_LOST)


class FollowerHealth:
    """The liveness endpoint while following (kopf serves it once this process leads): 200 with
    `{"leader": false, "holder": ...}`, since a follower is healthy, just not leading."""

    def __init__(self, endpoint: str, elector: leader.Elector):
        url = urlparse(endpoint)
        path, elector_ref = url.path or "/", elector

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                ok = self.path.split("?")[0] == path
                body = json.dumps({"leader": elector_ref.leading, "identity": elector_ref.config.identity,
                                   "holder": elector_ref.holder()} if ok else {"error": "not found"}).encode()
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer((url.hostname or "0.0.0.0", url.port or 80), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="follower-health", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
