"""The operator's own Prometheus metrics (`specfleet_...`), served when `SPECFLEET_METRICS_PORT` is set
(the operator image sets 9090)."""
from __future__ import annotations

import logging
import os

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

REGISTRY = CollectorRegistry()
_SERVICE = ["namespace", "name"]
DESIRED = Gauge("specfleet_desired_replicas", "Replicas the autoscaler wants.", _SERVICE, registry=REGISTRY)
ACTUAL = Gauge("specfleet_replicas", "Ready replicas.", _SERVICE, registry=REGISTRY)
ATTAINMENT = Gauge("specfleet_slo_attainment", "Share of the last window within the TTFT and ITL targets.",
                   _SERVICE, registry=REGISTRY)
BUDGET_ATTAINMENT = Gauge("specfleet_slo_window_attainment",
                          "Share of served requests that met both the TTFT and ITL targets, per rolling window.",
                          _SERVICE + ["window"], registry=REGISTRY)
BURN_RATE = Gauge("specfleet_error_budget_burn_rate",
                  "Error budget burn rate per rolling window (1: the budget lasts exactly the SLO period).",
                  _SERVICE + ["window"], registry=REGISTRY)
DECISIONS = Counter("specfleet_decisions", "Control decisions by kind (scale | speculation) and reason.",
                    _SERVICE + ["kind", "reason"], registry=REGISTRY)
PREDICTED = Gauge("specfleet_predicted_latency_seconds", "Planned p99 latency.", _SERVICE + ["metric"],
                  registry=REGISTRY)
OBSERVED = Gauge("specfleet_observed_latency_seconds", "Observed p99 latency over the last window.",
                 _SERVICE + ["metric"], registry=REGISTRY)
TARGET = Gauge("specfleet_slo_target_seconds", "Declared p99 latency target.", _SERVICE + ["metric"],
               registry=REGISTRY)
SPECULATION = Gauge("specfleet_speculation_enabled", "1 while the controller has speculation on.", _SERVICE,
                    registry=REGISTRY)
SPEC_K = Gauge("specfleet_speculation_k", "Speculation depth set by the controller.", _SERVICE, registry=REGISTRY)
ACCEPTANCE = Gauge("specfleet_acceptance_rate", "Observed (or counterfactual, while off) acceptance.", _SERVICE,
                   registry=REGISTRY)
OBJECTIVE = Gauge("specfleet_slo_objective", "Declared share of requests that must meet both targets "
                  "(the burn-rate alerts' budget is 1 - objective).", _SERVICE, registry=REGISTRY)
METRICS_SOURCE = Gauge("specfleet_metrics_source", "1 for the source (prometheus | direct) the service's last "
                       "control step read its engine series from, 0 for the other.", _SERVICE + ["source"],
                       registry=REGISTRY)
PROMETHEUS_QUERIES = Counter("specfleet_prometheus_queries", "PromQL queries made by the control loop for its fleet "
                             "snapshot (every pod's sample time, then the newer pods' series), by outcome (ok; error: "
                             "a failed refresh).", ["outcome"], registry=REGISTRY)
LEADER = Gauge("specfleet_operator_leader", "1 while this operator replica holds the leader Lease (and acts), "
               "0 while it follows.", registry=REGISTRY)


def serve_from_environment(log: logging.Logger | None = None) -> int | None:
    """Start the metrics endpoint on $SPECFLEET_METRICS_PORT; a busy port is logged, not fatal."""
    port = os.environ.get("SPECFLEET_METRICS_PORT")
    if not port:
        return None
    try:
        start_http_server(int(port), registry=REGISTRY)
    except OSError as exc:
        (log or logging.getLogger(__name__)).warning("metrics endpoint on port %s not started: %s", port, exc)
        return None
    return int(port)


class ServiceMetrics:
    """One service's children of the metrics above, each looked up once: `.labels(...)` validates its
    values and takes the metric's lock on every call, and a control interval sets some twenty of them.
    A gauge is set only when its value changed (`set`): most (targets, predictions, replicas, the
    speculation state) stay the same from one interval to the next, and each set takes a lock."""

    def __init__(self, namespace: str, name: str):
        self.service = (namespace, name)
        self._children: dict[tuple, object] = {}
        self._values: dict[tuple, float] = {}

    def __call__(self, metric, *labels: str):
        """The child of `metric` for this service and the further `labels` (window, metric, source...)."""
        key = (metric, labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*self.service, *labels)
        return child

    def set(self, metric, value: float, *labels: str) -> None:
        """Set a gauge child to `value`, unless this is the value last set through here (every write to
        this service's gauges goes through here, so the gauge holds it)."""
        key = (metric, labels)
        if self._values.get(key) != value:
            self(metric, *labels).set(value)
            self._values[key] = value
