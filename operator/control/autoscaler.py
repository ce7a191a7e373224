"""The autoscaler (pure): a metrics window and the calibrated model -> desired replicas, with a reason.

    arrivals = requests ended/s + growth/s of those in the engines (running + waiting)
               (without a count of ended requests: first tokens/s + queue growth/s + running growth/s)
    demand   = arrivals + headroom (1 x the observed arrival noise, <= 25%) + queue / drain time
    capacity = requests/s one replica carries at `target_utilization` of the batch that holds the ITL target
    need     = ceil(demand / capacity)

Faster up than down: a scale-up is immediate on an SLO violation, a growing queue, a jump of half the
fleet or more, or a trend (a rise out of the noise seen twice, or once while the fleet is short), which
provisions for the load one start-up delay ahead (not for the backlog built meanwhile: it stays with
the pods it was handed to), sized at `surge_utilization` of the SLO batch (the fast path), otherwise it waits for the recommendation to
persist over `scale_up_stabilization_seconds` (the smallest recommendation in that window wins). A scale-down takes the
largest recommendation of the last `scale_down_stabilization_seconds`, only once `down_cooldown_s` has passed
since the last scale-up, and only when the smaller fleet is predicted to hold the SLO. Steps are bounded
(up: x2 or +4, down: -25% or -1), results lie in [min, max], and an incomplete window (a pod not
scraped, no traffic evidence) changes nothing: missing is not zero.

Between two decisions `detect` looks at a short window (`detect_interval_s`) for a surge only: arrivals
out of the last decision's by more than the counting noise scale up at once, nothing else changes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from specfleet.operator import api
from specfleet.operator.capacity import TARGET_UTILIZATION, ServiceModel
from specfleet.operator.control.window import Window


@dataclass(frozen=True)
class ScalingPolicy(api.Autoscaling):
    """The InferenceService's declared `autoscaling` (bounds, stabilization windows) and the controller's own
    settings, which the CR does not expose."""
    target_utilization: float = TARGET_UTILIZATION  # share of the SLO batch and of the prefill rate a replica is sized
                                        # to use (the prefill share lower where the TTFT target needs it)
    scale_down_utilization: float = 0.95  # a smaller fleet must stay under this share to be chosen
    drain_s: float = 30.0               # a queue is planned to drain within this time
    max_up_factor: float = 2.0
    max_up_pods: int = 4
    fast_up_factor: float = 4.0         # bound of a fast-path step
    lookahead_s: float = 45.0           # a fast-path step provisions for the load this far ahead
                                        # (pod start-up + one interval: when new pods can first serve)
    startup_s: float = 30.0             # pod creation -> ready: the look-ahead of a detected surge
    max_growth: float = 3.0             # the prediction adds at most this many times the observed arrivals
    headroom_z: float = 1.0             # provision this many standard deviations of arrival noise
    headroom_cap: float = 0.25          # ... but at most this share of the arrivals
    noise_halflife_s: float = 300.0     # memory of the arrival-noise estimate
    jump_sigmas: float = 3.0            # a one-window rise counts when above this many noise deviations
    down_cooldown_s: float = 60.0       # no scale-down this soon after a scale-up (then the window rules):
                                        # the new pods start and serve a window before any is handed back
    max_down_share: float = 0.25
    detect_interval_s: float = 5.0      # `detect` looks at windows this long between decisions
    surge_utilization: float = 0.9      # share a predicted surge is sized at (the steady
                                        # path adds the rest to `target_utilization` once it is measured)

    @classmethod
    def from_spec(cls, autoscaling: api.Autoscaling, **over) -> "ScalingPolicy":
        return cls(**{f.name: getattr(autoscaling, f.name) for f in fields(api.Autoscaling)}, **over)


@dataclass(frozen=True)
class AutoscalerState:
    history: tuple[tuple[float, int], ...] = ()   # (time, recommended replicas), newest last
    last_up: float = -math.inf
    last_rps: float | None = None       # arrivals (req/s) of the previous window
    last_time: float | None = None
    last_seconds: float = 0.0           # length of the previous window
    last_inflight: float | None = None  # running + waiting at the previous window's end
    last_slope: float = 0.0             # arrival growth (req/s per s) seen by the previous window
    last_rising: bool = False           # the previous decision saw a trend (a rise out of the noise)
    noise: float = 0.0                  # EWMA of squared window-to-window arrival changes ((req/s)^2)


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
    arrivals = _arrivals(window, state)
    slope = _slope(window, state, arrivals)
    noise = _noise(window, state, arrivals, policy)
    # A rise is a trend when it stands out of the noise (the estimate, at least Poisson counting noise)
    # and either the previous window rose too or the fleet is already short (SLO miss, queue growing).
    # A one-window step with the SLO held is met by the load-based need alone (no extrapolation), so
    # a blip or an oscillation cannot ratchet the fleet up.
    jump = slope * window.seconds
    floor = 0.0 if state.last_rps is None else state.last_rps / window.seconds   # Poisson counting noise
    significant = jump > policy.jump_sigmas * math.sqrt(2 * max(state.noise, floor))
    growing = _growing(window, model, k)
    short = bool(_violation(window, model)) or growing
    rising = significant and (state.last_slope > 0 or short)
    state = replace(state, last_rps=arrivals, last_time=now, last_seconds=window.seconds, last_slope=slope,
                    last_rising=rising, noise=noise, last_inflight=_inflight(window))
    output = window.output_tokens_per_request
    per_replica = model.replica_rps(policy.target_utilization, alpha, k, output)
    headroom = _headroom(noise, arrivals, policy)
    demand = _demand(window, policy, arrivals) + headroom
    steady = _replicas(arrivals + headroom, per_replica, policy)
    need = _replicas(demand, per_replica, policy)
    violation = _violation(window, model)
    starting = ready is not None and ready < current
    backlog = window.queue_depth > 0 and (window.queue_growth_per_second or 0.0) >= 0
    # More replicas help an ITL miss only when the batch is what makes steps slow.
    crowded = (window.batch_size_mean or 0.0) >= policy.target_utilization * model.slo_batch(alpha, k)
    if violation and not starting and (backlog or ("ITL" in violation and crowded)):
        need = max(need, current + max(1, math.ceil(0.25 * current)))
    # The stabilization history keeps what the arrival rate needs, not transient backlog boosts.
    history = _trim(state.history + ((now, steady),), now, max(policy.scale_down_stabilization_seconds,
                                                                policy.scale_up_stabilization_seconds))
    state = replace(state, history=history)
    load = f"{demand:.2f} req/s against {per_replica:.2f} req/s per replica at the SLO"
    ahead = need
    if rising:
        surge = model.replica_rps(policy.surge_utilization, alpha, k, output)
        ahead = _ahead(policy, arrivals, slope, headroom, surge)
        if ahead > current and need <= current:
            need = ahead
            load = (f"arrivals {arrivals:.1f} req/s rising {slope:.2f} req/s per s; "
                    f"{per_replica:.2f} req/s per replica at the SLO")
    if need > current:
        return _up(policy, state, current, need, ahead, now, violation, load, growing, rising and slope > 0)
    if need < current:
        return _down(window, model, policy, state, current, need, now, demand, alpha, k, output, load)
    return ScaleDecision(current, current, "Stable", load, need), state


def detect(window: Window | None, model: ServiceModel, current: int, policy: ScalingPolicy,
           state: AutoscalerState, now: float, alpha: float = 0.0, k: int = 0, ready: int | None = None
           ) -> tuple[ScaleDecision, AutoscalerState]:
    """Surge detection between two decisions, on a short window (`detect_interval_s`): when its
    arrivals stand out of the last decision's by more than `jump_sigmas` deviations (Poisson counting
    noise of both windows plus the noise estimate), scale up at once (`LoadSurge`) to what `_ahead`
    asks for with the growth measured since that decision's window. It never scales down and leaves the
    history and the noise estimate to `decide`; only the time of a scale-up is kept (the cool-down)."""
    rise = _surge(window, state, policy)
    if rise is None:
        return ScaleDecision(current, current, "Stable", "no surge in the short window"), state
    arrivals, slope = rise
    output = window.output_tokens_per_request
    surge = model.replica_rps(policy.surge_utilization, alpha, k, output)
    headroom = _headroom(state.noise, arrivals, policy)
    near = replace(policy, lookahead_s=policy.startup_s + policy.detect_interval_s)   # the next look is that near
    need = _ahead(near, arrivals, slope, headroom, surge)
    target = min(need, max(math.ceil(current * policy.fast_up_factor), current + policy.max_up_pods),
                 policy.max_replicas)
    if target <= current:
        return ScaleDecision(current, current, "Stable", f"surge to {arrivals:.1f} req/s is covered", need), state
    message = (f"arrivals {arrivals:.1f} req/s over {window.seconds:.0f} s, {state.last_rps:.1f} req/s before "
               f"(rising {slope:.2f} req/s per s); {surge:.2f} req/s per replica at "
               f"{policy.surge_utilization:.0%} of the SLO batch")
    return ScaleDecision(current, target, "LoadSurge", message, need), replace(state, last_up=now)


def _surge(window: Window | None, state: AutoscalerState, policy: ScalingPolicy) -> tuple[float, float] | None:
    """(arrivals, growth per s) of a short window whose arrivals stand out of the previous decision's."""
    if _missing(window) or state.last_rps is None or state.last_time is None or state.last_seconds <= 0:
        return None
    arrivals = _conserved(window)
    if arrivals is None:
        return None
    base = state.last_rps
    deviation = math.sqrt(base / window.seconds + base / state.last_seconds + state.noise)
    # Growth since the last decision's arrivals: measured from the middle of its window when that
    # window was already rising; else the rise is taken to start where it ended, the steepest growth
    # consistent with both windows (a guess on the high side costs a few pod-minutes, one on the low
    # side leaves a crowd to too few pods).
    origin = state.last_time - (state.last_seconds / 2 if state.last_rising else 0.0)
    since = (window.start + window.end) / 2 - origin
    if arrivals - base <= policy.jump_sigmas * deviation or since <= 0:
        return None
    return arrivals, (arrivals - base) / since


def headroom(window: Window | None, state: AutoscalerState, policy: ScalingPolicy) -> float:
    """Requests/s the autoscaler provisions above the window's arrivals for their noise (0 when unknown):
    what another controller adds to the load to size as this one does."""
    arrivals = arrivals_of(window) if window is not None and window.complete else None
    return 0.0 if arrivals is None else _headroom(state.noise, arrivals, policy)


def _headroom(noise: float, arrivals: float, policy: ScalingPolicy) -> float:
    return min(policy.headroom_z * math.sqrt(noise), policy.headroom_cap * arrivals)


def arrivals_of(window: Window) -> float | None:
    """Requests arriving per second in one window on its own (conservation, else first tokens plus
    queue growth); None without a rate."""
    if window is None or window.requests_per_second is None:
        return _conserved(window) if window is not None else None
    return _arrivals(window)


def _conserved(window: Window) -> float | None:
    """Arrivals/s from conservation: requests that ended plus the growth of those in the engines
    (running + waiting); None without a count of ended requests or the running gauge."""
    if window.finished_per_second is None or window.running_growth_per_second is None:
        return None
    return max(0.0, window.finished_per_second + (window.queue_growth_per_second or 0.0)
               + window.running_growth_per_second)


def _ahead(policy: ScalingPolicy, arrivals: float, slope: float, headroom: float, per_replica: float) -> int:
    """Replicas for the load one start-up delay (plus an interval) ahead. The backlog built until new
    pods serve is not provisioned for: requests stay with the pod they were handed to (as behind
    cluster/gateway.py), so new pods cannot take it; they take the new arrivals, which lets the old
    pods drain their own."""
    growth = min(slope * policy.lookahead_s, policy.max_growth * arrivals)
    return _replicas(arrivals + growth + headroom, per_replica, policy)


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


def _follows(window: Window, state: AutoscalerState) -> bool:
    """The previous decision saw the window just before this one."""
    return (state.last_time is not None and window.end > window.start
            and abs(state.last_time - window.start) <= 0.5 * window.seconds)


def _slope(window: Window, state: AutoscalerState, arrivals: float) -> float:
    """Growth of the arrival rate (req/s per s) since the previous window; 0 when falling or unknown."""
    if state.last_rps is None or not _follows(window, state):
        return 0.0
    return max(0.0, (arrivals - state.last_rps) / window.seconds)


def _noise(window: Window, state: AutoscalerState, arrivals: float, policy: ScalingPolicy) -> float:
    """EWMA of the squared change of the arrival rate between windows (its variance, twice over)."""
    if state.last_rps is None or not _follows(window, state):
        return state.noise
    keep = 0.5 ** (window.seconds / policy.noise_halflife_s)
    # A change far out of the noise (a flash crowd) is a trend, not noise: it enters clipped at
    # `jump_sigmas` deviations of the larger of the estimate and Poisson counting noise.
    floor = max(state.noise, state.last_rps / window.seconds)
    change = min((arrivals - state.last_rps) ** 2 / 2, policy.jump_sigmas ** 2 * floor)
    return keep * state.noise + (1 - keep) * change


def _inflight(window: Window) -> float | None:
    if window.running is None or window.queue_depth is None:
        return None
    return window.running + window.queue_depth


def _arrivals(window: Window, state: AutoscalerState | None = None) -> float:
    """Requests arriving per second: by conservation when the engines count ended requests; else
    admitted ones plus the queue's growth (minus its shrinking), plus the growth of admitted requests
    still waiting for their first token (known from the running gauge when the previous window is the
    one just before)."""
    conserved = _conserved(window)
    if conserved is not None:
        return conserved
    rate = window.requests_per_second + (window.queue_growth_per_second or 0.0)
    if state is not None and state.last_inflight is not None and window.running is not None and _follows(window, state):
        then = state.last_inflight - (window.queue_depth - (window.queue_growth_per_second or 0.0) * window.seconds)
        rate += (window.running - then) / window.seconds
    return max(rate, 0.0)


def _demand(window: Window, policy: ScalingPolicy, arrivals: float) -> float:
    """Arrivals plus draining the queue within `drain_s` (the backlog counts for at most half again)."""
    return arrivals + min(window.queue_depth / policy.drain_s, 0.5 * arrivals)


def _violation(window: Window, model: ServiceModel) -> str:
    ttft, itl = window.ttft_p99, window.itl_p99
    if ttft is not None and ttft > model.ttft_s:
        return f"TTFT p99 {ttft * 1000:.0f} ms > {model.ttft_s * 1000:g} ms"
    if itl is not None and itl > model.itl_s:
        return f"ITL p99 {itl * 1000:.1f} ms > {model.itl_s * 1000:g} ms"
    return ""


def _backlogged(window: Window, model: ServiceModel, k: int = 0) -> bool:
    """More prompts waiting than the pods prefill in half the TTFT budget: a backlog, not the few that
    Poisson arrivals keep waiting at a busy prefill (vllm:num_requests_waiting is rarely 0 under load)."""
    allowance = model.queue_allowance(window.batch_size_mean or 1.0, k)
    return window.queue_depth > max(1, window.pods_scraped) * max(1.0, allowance / 2)


def _growing(window: Window, model: ServiceModel, k: int = 0) -> bool:
    return (window.queue_growth_per_second or 0.0) > 0 and _backlogged(window, model, k)


def _up(policy, state, current, need, ahead, now, violation, load, growing, rising=False):
    fast = "SLOViolation" if violation and need > current else ("QueueGrowing" if growing else
                                             ("LoadJump" if need >= 1.5 * current else
                                              ("LoadRising" if rising and ahead > current else "")))
    factor = policy.fast_up_factor if fast else policy.max_up_factor
    bound = max(math.ceil(current * factor), current + policy.max_up_pods)
    target = min(max(need, ahead) if fast else need, bound, policy.max_replicas)
    if target <= current:
        return ScaleDecision(current, current, "AtMaxReplicas", f"need {need}; {load}", need), state
    if not fast:
        window_start = now - policy.scale_up_stabilization_seconds
        if state.history[0][0] > window_start + 1e-6 and policy.scale_up_stabilization_seconds > 0:
            return ScaleDecision(current, current, "Stabilizing", f"need {need} for less than "
                                 f"{policy.scale_up_stabilization_seconds:g} s; {load}", need), state
        target = min(target, min(n for t, n in state.history if t >= window_start - 1e-6))
        if target <= current:
            return ScaleDecision(current, current, "Stabilizing", f"need {need}; {load}", need), state
    detail = violation or load
    return ScaleDecision(current, target, fast or "LoadIncrease", detail, need), replace(state, last_up=now)


def _down(window, model, policy, state, current, need, now, demand, alpha, k, output, load):
    span = policy.scale_down_stabilization_seconds
    if now - state.last_up < min(span, policy.down_cooldown_s) or state.history[0][0] > now - span + 1e-6:
        return ScaleDecision(current, current, "Stabilizing", f"need {need}; waiting out the {span:g} s "
                             f"scale-down window; {load}", need), state
    if _backlogged(window, model, k) or _violation(window, model):
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
