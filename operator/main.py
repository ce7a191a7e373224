"""Run the operator: kopf embedded in this process (`specfleet operator run`).

Standalone (no peering objects), for one namespace, several, or the whole cluster. Credentials come
from the in-cluster service account or KUBECONFIG.
"""
from __future__ import annotations

import logging


def run(namespaces: list[str] | None = None, clusterwide: bool = False, liveness: str | None = None,
        verbose: bool = False) -> None:
    """Block running the operator until SIGINT/SIGTERM."""
    import kopf

    from specfleet.operator import handlers  # noqa: F401  (registers the handlers)

    if not clusterwide and not namespaces:
        raise ValueError("give namespaces or clusterwide=True")
    from specfleet.operator.control import telemetry

    kopf.configure(verbose=verbose)
    if not verbose:     # one line per scrape of every pod drowns kopf's own messages
        for name in ("httpx", "httpcore"):
            logging.getLogger(name).setLevel(logging.WARNING)
    telemetry.serve_from_environment()
    kopf.run(standalone=True, clusterwide=clusterwide, namespaces=namespaces or [],
             liveness_endpoint=liveness)
