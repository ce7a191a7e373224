"""The speculation controller (pure): per service, off or on with depth k, from the observed batch,
acceptance and load.

The acceptance probability a comes from the window: measured acceptance while on, the engines'
counterfactual n-gram acceptance while off (both converted from accepted/drafted tokens to the
per-token probability of the goodput model). So does the draft share, per depth: n-gram drafting
finds a match for only some sequence-steps, often shorter than k, and only the drafted tokens verify
(and gain) anything; the engines count fresh proposal lengths the same way on and off. The goodput
model gives k*(batch, a) and the batch thresholds. A dead band around break-even, as wide as the cost's
own error (`speedup_band`): on -> off only past the batch where the priced speed-up falls below
1 - band, off -> on only below the batch where it exceeds 1 + band. Where the speed-up runs within a few
percent of 1 over a wide range of batches (a CPU), a hysteresis in the batch alone does nothing: the
threshold moves with every few percent of the price, and the state would follow the noise. On top,
hysteresis on both thresholds: on -> off when the batch exceeds the band's edge by `batch_hysteresis`
or a falls `acceptance_hysteresis` below `minAcceptanceRate`; off -> on only when both clear by the
same margins; acceptance counts as low only when it is low by two standard errors of the window's
drafts. A state is kept at least `dwell_s` (longer for
the vLLM runtime, where a switch is a rolling restart). While off without counterfactual evidence it
re-probes: on for one dwell every `reprobe_s`, if the batch allows.

Draft tokens to verify share the step's token budget with prompts (the engine schedules running
sequences first), so on a prefill-bound service speculation lowers the requests/s a replica carries.
It stays on only while it is free: while the replicas the load needs without it (at the autoscaler's
utilization, at least `min_replicas`; all serving ones with a fixed replica count) also carry the
load with it. Otherwise k steps down to the
deepest free depth, or speculation goes off (`CostsReplicas`); it comes back when the load clears
that bound by `batch_hysteresis`. A fixed fleet speculating whose queue drains (what stands in it through a
window waits under half the TTFT target: `capacity.carried`) carries its load as it is, so speculation
stays on there whatever the capacity model prices. On a surge (`on_surge`, from surge detection between intervals) the
check runs at once on the short window, past the dwell: switching speculation off is the only
capacity that arrives before new pods do.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from specfleet.operator.capacity import TARGET_UTILIZATION, Load, ServiceModel, affordable_k, costs_replicas
from specfleet.operator.control.autoscaler import arrivals_of
from specfleet.operator.control.window import Window
from specfleet.operator.cost import alpha_from_acceptance, share_per_step

SPECFLEET_DWELL_S, VLLM_DWELL_S = 60.0, 600.0
# The dead band's half-width when the policy does not fix one: the service cost's relative error
# (`status.calibration.fitError`), within these bounds; the default where the cost states none.
MIN_BAND, MAX_BAND, DEFAULT_BAND = 0.02, 0.10, 0.05


@dataclass(frozen=True)
class SpeculationPolicy:
    mode: str = "auto"                   # auto | on | off
    max_k: int = 4
    min_acceptance: float = 0.5
    batch_hysteresis: float = 0.15
    acceptance_hysteresis: float = 0.05
    dwell_s: float = SPECFLEET_DWELL_S
    reprobe_s: float = 300.0
    utilization: float = TARGET_UTILIZATION   # capacity as the autoscaler sizes it
    min_replicas: int = 1
    fixed_replicas: bool = False         # no autoscaler (spec.replicas): every serving replica stays
    speedup_band: float | None = None    # dead band around a speed-up of 1; None: the cost's own error

    @classmethod
    def from_spec(cls, speculation, engine: str = "specfleet", autoscaling=None, fixed_replicas: bool = False,
                  **over) -> "SpeculationPolicy":
        dwell = VLLM_DWELL_S if engine == "vllm" else SPECFLEET_DWELL_S
        floor = {"min_replicas": autoscaling.min_replicas} if autoscaling is not None else {}
        return cls(mode=speculation.mode, max_k=speculation.max_speculative_tokens,
                   min_acceptance=speculation.min_acceptance_rate, fixed_replicas=fixed_replicas,
                   **{"dwell_s": dwell, **floor, **over})


@dataclass(frozen=True)
class SpeculationState:
    enabled: bool
    k: int
    since: float = float("-inf")         # time of the last switch
    probing: bool = False


@dataclass(frozen=True)
class SpeculationDecision:
    enabled: bool
    k: int
    reason: str
    message: str
    changed: bool = False
    alpha: float | None = None
    threshold: int | None = None         # maxBatchForSpeculation at alpha


def decide(window: Window | None, model: ServiceModel, policy: SpeculationPolicy, state: SpeculationState,
           now: float, headroom: float = 0.0) -> tuple[SpeculationDecision, SpeculationState]:
    """`headroom`: requests/s the autoscaler provisions above the arrivals (`autoscaler.headroom`), so
    that "free in replicas" is judged on the load the replicas are sized for."""
    if policy.mode == "off" or policy.max_k <= 0:
        return _hold(state, "Disabled", "speculation.mode is off"), replace(state, enabled=False)
    batch = window.batch_size_mean if window is not None and window.complete else None
    if batch is None:
        return _hold(state, "MetricsUnavailable", "no batch-size evidence in the window; holding"), state
    batch_per_pod = batch
    alpha = _alpha(window, state)
    model = model.with_draft_share(_share(window, state, alpha))
    if policy.mode == "on":
        return _forced_on(model, policy, state, batch_per_pod, alpha, now)
    load = _load(window, headroom)
    if state.enabled:
        return _while_on(model, policy, state, batch_per_pod, alpha, now, load, _alpha_high(window, state, alpha))
    return _while_off(model, policy, state, batch_per_pod, alpha, now, load)


def _admitted(window: Window) -> float | None:
    """Requests/s the engines took in: first tokens plus the growth of their waiting queues. Unlike the
    autoscaler's conservation estimate it ignores the running count, which a switch of speculation
    itself moves (requests finish faster or slower), so a switch cannot argue for the next one."""
    if window.requests_per_second is None:
        return arrivals_of(window)
    return window.requests_per_second + max(0.0, window.queue_growth_per_second or 0.0)


def _load(window: Window, headroom: float) -> Load:
    admitted = _admitted(window)
    return Load(None if admitted is None else admitted + headroom, window.pods_scraped, _backlog(window))


def _backlog(window: Window) -> float | None:
    """Requests that waited through the window: the fewer of those waiting at its two ends. A request that
    arrives between two steps waits until the next one; a queue that is empty at either end was drained."""
    if window.queue_depth is None or window.queue_growth_per_second is None:
        return None
    before = window.queue_depth - window.queue_growth_per_second * (window.end - window.start)
    return max(0.0, min(window.queue_depth, before))


def on_surge(window: Window | None, model: ServiceModel, policy: SpeculationPolicy, state: SpeculationState,
             now: float, headroom: float = 0.0) -> tuple[SpeculationDecision | None, SpeculationState]:
    """Between intervals, when a surge was detected: off at once (no dwell) if speculating costs
    replicas at the short window's load; None otherwise (nothing else changes here)."""
    if not state.enabled or policy.mode != "auto" or window is None or not window.complete:
        return None, state
    alpha = _alpha(window, state)
    model = model.with_draft_share(_share(window, state, alpha))
    costly = costs_replicas(model, policy, _load(window, headroom),
                            policy.min_acceptance if alpha is None else alpha, state.k)
    if not costly:
        return None, state
    return _switch(state, False, state.k, "SurgeCostsReplicas", f"surge: {costly}", now, alpha, None)




def _depth(window: Window, state: SpeculationState) -> int:
    """The k the window's acceptance was measured at."""
    return window.num_speculative_tokens or state.k or 1


def _alpha(window: Window, state: SpeculationState) -> float | None:
    rate = window.acceptance_rate if state.enabled else window.counterfactual_acceptance_rate
    return None if rate is None else alpha_from_acceptance(rate, _depth(window, state))


def _alpha_high(window: Window, state: SpeculationState, alpha: float | None) -> float | None:
    """The acceptance probability two standard errors above the measured one, drafts as the trials: a few
    drafts in a short window (the end of a ramp, a 2 s interval) cannot show acceptance too low on their
    own. Where the engines count accepted tokens by position, it is the first draft token's acceptance:
    n-gram acceptance falls with the position (a copied run ends), so the per-token probability that
    a geometric model infers from all k positions reads low at k = 4 where one token ahead is accepted
    often (copy-heavy: 0.73 of 4 tokens, 0.93 of 1). Without a draft count, the measured value."""
    if alpha is None or not window.drafts or window.acceptance_rate is None:
        return alpha
    first = window.first_token_acceptance
    rate = window.acceptance_rate if first is None else first
    high = min(1.0, rate + 2 * math.sqrt(max(rate * (1 - rate), 0.0) / window.drafts))
    return high if first is not None else alpha_from_acceptance(high, _depth(window, state))


def _share(window: Window, state: SpeculationState, alpha: float | None) -> tuple[float, ...] | float | None:
    """Draft share per sequence-step by depth, from the engines' fresh n-gram proposal lengths. On, they
    count them per step; off, per token, which `share_per_step` converts at the acceptance `alpha`
    (accepted drafts pass through the positions that have them in fewer steps). An engine without
    those counters gives the drafted share at its k while on, nothing while off."""
    if not window.draft_shares:
        return window.draft_share if state.enabled else None
    if state.enabled or alpha is None:
        return window.draft_shares
    return tuple(share_per_step(s, alpha, k) for k, s in enumerate(window.draft_shares, start=1))


def speedup_band(model: ServiceModel, policy: SpeculationPolicy) -> float:
    """Half-width of the dead band around a speed-up of 1: a price within the cost's own error of 1 does
    not say which state is better, so the state stays."""
    if policy.speedup_band is not None:
        return policy.speedup_band
    error = model.calibration.fit_error
    return min(MAX_BAND, max(MIN_BAND, DEFAULT_BAND if error is None else error))


def _pays(model: ServiceModel, gain: float, k: int, threshold: int, edge: float) -> str:
    """The threshold (the batch where the priced speed-up crosses `edge`, the dead band's edge), with the
    speed-up `gain` the model prices at this batch at depth k: where that stays near 1 over a wide range
    of batches (a CPU), a few percent in a step-cost scale move a plain break-even a long way."""
    return (f"speculation pays up to batch {threshold} at the dead band's edge x{edge:.2f} (x{gain:.2f} here "
            f"at k={k}, draft share {model.share_at(k):.2f})")


def _hold(state: SpeculationState, reason: str, message: str, alpha=None, threshold=None) -> SpeculationDecision:
    return SpeculationDecision(state.enabled, state.k, reason, message, False, alpha, threshold)


def _switch(state, enabled, k, reason, message, now, alpha, threshold, probing=False):
    decision = SpeculationDecision(enabled, k, reason, message, True, alpha, threshold)
    return decision, SpeculationState(enabled, k, now, probing)


def _forced_on(model, policy, state, batch, alpha, now):
    k = model.best_k(batch, alpha) if alpha is not None else state.k
    k = max(1, min(k or state.k or 1, policy.max_k))
    if state.enabled and k == state.k:
        return _hold(state, "Forced", "speculation.mode is on", alpha), state
    if state.enabled and now - state.since < policy.dwell_s:
        return _hold(state, "Dwell", "speculation.mode is on", alpha), state
    return _switch(state, True, k, "Forced", f"speculation.mode is on; k={k}", now, alpha, None)


def _while_on(model, policy, state, batch, alpha, now, load=None, alpha_high=None):
    if alpha is None:
        return _hold(state, "MetricsUnavailable", "no drafted tokens in the window; holding"), state
    band, (gain, gain_k) = speedup_band(model, policy), model.speedup(batch, alpha)
    threshold = model.max_batch_for_speculation(alpha, -band)
    seen = f"batch {batch:.1f}, acceptance {alpha:.2f}, {_pays(model, gain, gain_k, threshold, 1 - band)}"
    dwelling = now - state.since < policy.dwell_s
    if (alpha if alpha_high is None else alpha_high) < policy.min_acceptance - policy.acceptance_hysteresis:
        if dwelling:
            return _hold(state, "Dwell", f"would turn off (low acceptance); {seen}", alpha, threshold), state
        return _switch(state, False, state.k, "LowAcceptance", f"acceptance {alpha:.2f} < minAcceptanceRate "
                       f"{policy.min_acceptance:g} - {policy.acceptance_hysteresis:g}; {seen}", now, alpha, threshold)
    if batch > threshold * (1 + policy.batch_hysteresis):
        if dwelling:
            return _hold(state, "Dwell", f"would turn off (batch); {seen}", alpha, threshold), state
        return _switch(state, False, state.k, "BatchAboveThreshold", f"batch {batch:.1f} > {threshold} x "
                       f"{1 + policy.batch_hysteresis:g}; {seen}", now, alpha, threshold)
    costly = costs_replicas(model, policy, load, alpha, state.k)
    if costly:
        if dwelling:
            return _hold(state, "Dwell", f"would turn off (costs replicas); {costly}", alpha, threshold), state
        shallower = affordable_k(model, policy, load, alpha, state.k - 1)
        if shallower >= 1:
            return _switch(state, True, shallower, "DepthRetuned", f"k {state.k} -> {shallower}: {costly}", now,
                           alpha, threshold)
        return _switch(state, False, state.k, "CostsReplicas", costly, now, alpha, threshold)
    best = min(model.best_k(batch, alpha), policy.max_k)
    if best > state.k:     # deeper only while the deeper k is free with the hysteresis margin to spare
        best = max(affordable_k(model, policy, load, alpha, best, policy.batch_hysteresis), state.k)
    if best >= 1 and best != state.k and not dwelling:
        return _switch(state, True, best, "DepthRetuned", f"k {state.k} -> {best} maximises goodput; {seen}",
                       now, alpha, threshold)
    reason = "Paying" if gain >= 1 else "WithinCostError"
    return _hold(state, reason, seen, alpha, threshold), replace(state, probing=False)


def _while_off(model, policy, state, batch, alpha, now, load=None):
    dwelling = now - state.since < policy.dwell_s
    if alpha is None:
        threshold = model.max_batch_for_speculation(policy.min_acceptance, speedup_band(model, policy))
        due = now - state.since >= policy.reprobe_s
        k = affordable_k(model, policy, load, policy.min_acceptance,
                         max(1, min(model.best_k(batch, policy.min_acceptance) or 1, policy.max_k)),
                          policy.batch_hysteresis)
        if due and k >= 1 and batch < threshold * (1 - policy.batch_hysteresis):
            return _switch(state, True, k, "Reprobe", f"no counterfactual acceptance while off; probing k={k} at "
                           f"batch {batch:.1f}", now, None, threshold, probing=True)
        return _hold(state, "NoAcceptanceEvidence", f"off; batch {batch:.1f}; next probe after "
                     f"{policy.reprobe_s:g} s off", None, threshold), state
    band = speedup_band(model, policy)
    threshold = model.max_batch_for_speculation(alpha, band)
    seen = (f"batch {batch:.1f}, counterfactual acceptance {alpha:.2f}, "
            f"{_pays(model, *model.speedup(batch, alpha), threshold, 1 + band)}")
    clears = (alpha >= policy.min_acceptance + policy.acceptance_hysteresis
              and batch < threshold * (1 - policy.batch_hysteresis))
    k = min(model.best_k(batch, alpha, band), policy.max_k)
    if not clears or k < 1:
        return _hold(state, "NotPaying", seen, alpha, threshold), state
    affordable = affordable_k(model, policy, load, alpha, k, policy.batch_hysteresis)
    if affordable < 1:
        return _hold(state, "CostsReplicas", costs_replicas(model, policy, load, alpha, 1, policy.batch_hysteresis),
                     alpha, threshold), state
    k = affordable
    if dwelling:
        return _hold(state, "Dwell", f"would turn on; {seen}", alpha, threshold), state
    return _switch(state, True, k, "SpeculationPays", f"k={k}; {seen}", now, alpha, threshold)
