"""Scale to zero and back (pure): when an idle service goes to 0, when held requests wake it, and the
cold start that follows.

Going to 0 is the control loop's (`loop.idle_scale`): with `autoscaling.minReplicas: 0`, after
`autoscaling.idleSeconds` (default 300) of complete windows with no request started, none running and
none waiting. Coming back is not the loop's: a service at 0 has no pods to scrape. The gateway holds
the requests of a service with no ready replica and announces how many on the InferenceService, one
annotation per gateway replica, `held.gateway.specfleet.io/<gateway id>: "<count>"` (docs/design.md,
the gateway section); the annotation change reaches the operator's watch at once, and a service at 0
replicas with held requests is scaled to 1. The cold start is the time from that wake-up to the
Deployment's first ready replica, reported in `status.coldStart`.
"""
from __future__ import annotations

from typing import Mapping

from specfleet.operator import api

HELD_PREFIX = "held.gateway.specfleet.io/"
DEFAULT_IDLE_S = 300
WAKE_IN_FLIGHT_S = 30.0     # a wake-up younger than this is not repeated while the watch still reports 0


def held_requests(annotations: Mapping[str, str] | None) -> int:
    """The requests the gateways hold for a service: the sum over their annotations (a value that is not
    a non-negative integer counts 0)."""
    total = 0
    for key, value in (annotations or {}).items():
        if key.startswith(HELD_PREFIX) and str(value).isdigit():
            total += int(value)
    return total


def should_wake(spec: api.InferenceServiceSpec, held: int, replicas: tuple[int, int] | None) -> bool:
    """Scale 0 -> 1: the service may go to zero (and is autoscaled, serving), is at 0, and requests wait."""
    return (held > 0 and replicas is not None and replicas[0] == 0 and spec.autoscaling.min_replicas == 0
            and spec.replicas is None and not spec.plan_only)


def idle_seconds(spec: api.InferenceServiceSpec) -> int:
    return spec.autoscaling.idle_seconds or DEFAULT_IDLE_S


def cold_start_status(seconds: float, held: int, when: str) -> dict:
    return {"coldStart": {"lastSeconds": round(seconds, 3), "heldRequests": held, "at": when}}
