"""The gateway's Prometheus metrics, in a registry of its own (served on `/metrics`).

Labels are the InferenceService's namespace and name, never the request's `model` text: a client
cannot grow the series by inventing model names (unknown models count under empty labels).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

SERVICE = ("namespace", "service")
QUEUE_BUCKETS = (0.001, 0.005, 0.025, 0.1, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)


@dataclass
class GatewayMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.requests = Counter("specfleet_gateway_requests", "Requests answered, by service and HTTP code.",
                                [*SERVICE, "code"], registry=r)
        self.retries = Counter("specfleet_gateway_retries", "Upstream attempts beyond a request's first.",
                               SERVICE, registry=r)
        self.queue_seconds = Histogram("specfleet_gateway_queue_seconds",
                                       "Time from arrival to the first upstream attempt (held time included).",
                                       SERVICE, buckets=QUEUE_BUCKETS, registry=r)
        self.held = Gauge("specfleet_gateway_held_requests",
                          "Requests held now because the service has no ready replica.", SERVICE, registry=r)
        self.endpoints = Gauge("specfleet_gateway_ready_endpoints", "Ready pods the gateway routes to.",
                               SERVICE, registry=r)

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def labels(service_key: str) -> tuple[str, str]:
    """"ns/name" -> (ns, name); "" -> ("", "")."""
    namespace, _, name = service_key.partition("/")
    return namespace, name
