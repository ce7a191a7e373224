"""The autoscaler (pure): a metrics window and the calibrated model -> desired replicas, with a reason.

    demand   = admitted requests/s + queue growth/s + queue / drain time
    capacity = requests/s one replica carries at `target_utilization` of the batch that holds the ITL target
    need     = ceil(demand / capacity)

Faster up than down: a scale-up is immediate on an SLO violation, a growing queue or a jump of half the
fleet or more (the fast path), otherwise it waits for the recommendation to persist over
`scale_up_stabilization_s` (the smallest recommendation in that window wins). A scale-down takes the
largest recommendation of the last `scale_down_stabilization_s`, only once that much time has passed
since the last change, and only when the smaller fleet is predicted to hold the SLO. Steps are bounded
(up: x2 or +4, down: -25% or -1), results lie in [min, max], and an incomplete window (a pod not
scraped, no traffic evidence) changes nothing: missing is not zero.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from specfleet.operator.control.calibration import ServiceModel
from specfleet.operator.control.window import Window


@dataclass(frozen=True)
class ScalingPolicy:
    min_replicas: int = 1
    max_replicas: int = 4
    scale_up_stabilization_s: float = 30.0
    scale_down_stabilization_s: float = 300.0
    target_utilization: float = 0.7     # share of the SLO batch a replica is sized to carry
    scale_down_utilization: float = 0.8  # a smaller fleet must stay under this share to be chosen
    drain_s: float = 30.0               # a queue is planned to drain within this time
    max_up_factor: float = 2.0
    max_up_pods: int = 4
    fast_up_factor: float = 4.0         # bound of a fast-path step
    lookahead_s: float = 45.0           # a fast-path step provisions for the load this far ahead
    max_down_share: float = 0.25

    @classmethod
    def from_spec(cls, autoscaling, **over) -> "ScalingPolicy":
        return cls(min_replicas=autoscaling.min_replicas, max_replicas=autoscaling.max_replicas,
                   scale_up_stabilization_s=autoscaling.scale_up_stabilization_seconds,
                   scale_down_stabilization_s=autoscaling.scale_down_stabilization_seconds, **over)


@dataclass(frozen=True)
class AutoscalerState:
    history: tuple[tuple[float, int], ...] = ()   # (time, recommended replicas), newest last
    last_up: float = -math.inf
    last_rps: float | None = None
    last_time: float | None = None


@dataclass(frozen=True)
class ScaleDecision:
    current: int
    desired: int
    reason: str
    message: str
    need: int | None = None          # unbounded recommendation, for status and metrics

    @property
    def changed(self) -> bool:
        return self.desired != self.current


def decide(window: Window | None, model: ServiceModel, current: int, policy: ScalingPolicy,
           state: AutoscalerState, now: float, alpha: float = 0.0, k: int = 0, ready: int | None = None
           ) -> tuple[ScaleDecision, AutoscalerState]:
    """Desired replicas for the window; `alpha`/`k` are the speculation in effect (k = 0: off);
    `ready` is how many of the `current` replicas serve (default: all)."""
    clamped = min(max(current, policy.min_replicas), policy.max_replicas)
    if clamped != current:
        return ScaleDecision(current, clamped, "OutOfBounds", f"{current} replicas is outside "
                             f"[{policy.min_replicas}, {policy.max_replicas}]"), replace(state, last_up=now)
    missing = _missing(window)
    if missing:
        return ScaleDecision(current, current, "MetricsUnavailable", missing), state
    demand = _demand(window, policy)
    slope = _slope(window, state)
    state = replace(state, last_rps=_arrivals(window), last_time=now)
    output = window.output_tokens_per_request
    per_replica = model.replica_rps(policy.target_utilization, alpha, k, output)
    steady = _replicas(_arrivals(window), per_replica, policy)
    need = _replicas(demand, per_replica, policy)
    violation = _violation(window, model)
    starting = ready is not None and ready < current
    backlog = window.queue_depth > 0 and (window.queue_growth_per_second or 0.0) >= 0
    # More replicas help an ITL miss only when the batch is what makes steps slow.
    crowded = (window.batch_size_mean or 0.0) >= policy.target_utilization * model.slo_batch(alpha, k)
    if violation and not starting and (backlog or ("ITL" in violation and crowded)):
        need = max(need, current + max(1, math.ceil(0.25 * current)))
    # The stabilization history keeps what the arrival rate needs, not transient backlog boosts.
    history = _trim(state.history + ((now, steady),), now, max(policy.scale_down_stabilization_s,
                                                                policy.scale_up_stabilization_s))
    state = replace(state, history=history)
    load = f"{demand:.2f} req/s against {per_replica:.2f} req/s per replica at the SLO"
    if need > current:
        ahead = _replicas(demand + min(slope * policy.lookahead_s, 0.5 * _arrivals(window)), per_replica, policy)
        return _up(window, policy, state, current, need, ahead, now, violation, load)
    if need < current:
        return _down(window, model, policy, state, current, need, now, demand, alpha, k, output, load)
    return ScaleDecision(current, current, "Stable", load, need), state


def _missing(window: Window | None) -> str:
    if window is None:
        return "no metrics window yet (need two scrapes of every ready pod)"
    if not window.complete:
        return f"scraped {window.pods_scraped} of {window.pods_expected} ready pods; holding"
    if window.requests_per_second is None or window.queue_depth is None:
        return "request rate or queue depth missing from the engines' metrics; holding"
    return ""


def _replicas(demand: float, per_replica: float, policy: ScalingPolicy) -> int:
    need = math.ceil(demand / per_replica - 1e-9) if demand > 0 else 0
    return max(need, policy.min_replicas)


def _slope(window: Window, state: AutoscalerState) -> float:
    """Growth of the arrival rate (req/s per s) since the previous window; 0 when falling or unknown."""
    if state.last_rps is None or state.last_time is None or window.end <= window.start:
        return 0.0
    return max(0.0, (_arrivals(window) - state.last_rps) / max(window.seconds, 1e-9))


def _arrivals(window: Window) -> float:
    """Requests arriving per second: admitted ones plus the queue's growth (minus its shrinking)."""
    return max(window.requests_per_second + (window.queue_growth_per_second or 0.0), 0.0)


def _demand(window: Window, policy: ScalingPolicy) -> float:
    """Arrivals plus draining the queue within `drain_s` (the backlog counts for at most half again)."""
    arrivals = _arrivals(window)
    return arrivals + min(window.queue_depth / policy.drain_s, 0.5 * arrivals)


def _violation(window: Window, model: ServiceModel) -> str:
    ttft, itl = window.ttft_p99, window.itl_p99
    if ttft is not None and ttft > model.ttft_s:
        return f"TTFT p99 {ttft * 1000:.0f} ms > {model.ttft_s * 1000:g} ms"
    if itl is not None and itl > model.itl_s:
        return f"ITL p99 {itl * 1000:.1f} ms > {model.itl_s * 1000:g} ms"
    return ""


def _growing(window: Window) -> bool:
    return (window.queue_growth_per_second or 0.0) > 0 and window.queue_depth > max(1.0, window.pods_scraped)


def _up(window, policy, state, current, need, ahead, now, violation, load):
    fast = "SLOViolation" if violation and need > current else ("QueueGrowing" if _growing(window) else
                                             ("LoadJump" if need >= 1.5 * current else ""))
    factor = policy.fast_up_factor if fast else policy.max_up_factor
    bound = max(math.ceil(current * factor), current + policy.max_up_pods)
    target = min(max(need, ahead) if fast else need, bound, policy.max_replicas)
    if target <= current:
        return ScaleDecision(current, current, "AtMaxReplicas", f"need {need}; {load}", need), state
    if not fast:
        window_start = now - policy.scale_up_stabilization_s
        if state.history[0][0] > window_start + 1e-6 and policy.scale_up_stabilization_s > 0:
            return ScaleDecision(current, current, "Stabilizing", f"need {need} for less than "
                                 f"{policy.scale_up_stabilization_s:g} s; {load}", need), state
        target = min(target, min(n for t, n in state.history if t >= window_start - 1e-6))
        if target <= current:
            return ScaleDecision(current, current, "Stabilizing", f"need {need}; {load}", need), state
    detail = violation or load
    return ScaleDecision(current, target, fast or "LoadIncrease", detail, need), replace(state, last_up=now)


def _down(window, model, policy, state, current, need, now, demand, alpha, k, output, load):
    span = policy.scale_down_stabilization_s
    if now - state.last_up < span or state.history[0][0] > now - span + 1e-6:
        return ScaleDecision(current, current, "Stabilizing", f"need {need}; waiting out the {span:g} s "
                             f"scale-down window; {load}", need), state
    if window.queue_depth > 0 or _violation(window, model):
        return ScaleDecision(current, current, "Stable", f"queue {window.queue_depth:g}; not scaling down",
                             need), state
    target = max(n for t, n in state.history if t >= now - span - 1e-6)
    target = max(target, current - max(1, math.floor(current * policy.max_down_share)), policy.min_replicas)
    if target >= current:
        return ScaleDecision(current, current, "Stable", load, need), state
    holds = demand <= target * model.replica_rps(policy.scale_down_utilization, alpha, k, output)
    if not holds:
        return ScaleDecision(current, current, "SmallerFleetWouldMissSLO", f"{target} replicas would run above "
                             f"{policy.scale_down_utilization:.0%} of the SLO batch; {load}", need), state
    return ScaleDecision(current, target, "LoadDecrease", load, need), state


def _trim(history: tuple[tuple[float, int], ...], now: float, keep_s: float) -> tuple[tuple[float, int], ...]:
    """Entries inside the window plus the newest one before it (so the window's span is known)."""
    inside = [i for i, (t, _) in enumerate(history) if t >= now - keep_s - 1e-6]
    first = max(0, (inside[0] if inside else len(history) - 1) - 1)
    return history[first:]
