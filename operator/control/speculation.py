"""The speculation controller (pure): per service, off or on with depth k, from the observed batch and
acceptance.

The acceptance probability a comes from the window: measured acceptance while on, the engines'
counterfactual n-gram acceptance while off (both converted from accepted/drafted tokens to the
per-token probability of the goodput model). The goodput model gives k*(batch, a) and
maxBatchForSpeculation(a). Hysteresis on both thresholds: on -> off when the batch exceeds the
threshold by `batch_hysteresis` or a falls `acceptance_hysteresis` below `minAcceptanceRate`;
off -> on only when both clear by the same margins. A state is kept at least `dwell_s` (longer for the
vLLM runtime, where a switch is a rolling restart). While off without counterfactual evidence it
re-probes: on for one dwell every `reprobe_s`, if the batch allows.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from specfleet.operator.control.calibration import ServiceModel, alpha_from_acceptance
from specfleet.operator.control.window import Window

SPECFLEET_DWELL_S, VLLM_DWELL_S = 60.0, 600.0


@dataclass(frozen=True)
class SpeculationPolicy:
    mode: str = "auto"                   # auto | on | off
    max_k: int = 4
    min_acceptance: float = 0.5
    batch_hysteresis: float = 0.15
    acceptance_hysteresis: float = 0.05
    dwell_s: float = SPECFLEET_DWELL_S
    reprobe_s: float = 300.0

    @classmethod
    def from_spec(cls, speculation, engine: str = "specfleet", **over) -> "SpeculationPolicy":
        dwell = VLLM_DWELL_S if engine == "vllm" else SPECFLEET_DWELL_S
        return cls(mode=speculation.mode, max_k=speculation.max_speculative_tokens,
                   min_acceptance=speculation.min_acceptance_rate, **{"dwell_s": dwell, **over})


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
           now: float) -> tuple[SpeculationDecision, SpeculationState]:
    if policy.mode == "off" or policy.max_k <= 0:
        return _hold(state, "Disabled", "speculation.mode is off"), replace(state, enabled=False)
    batch = window.batch_size_mean if window is not None and window.complete else None
    if batch is None:
        return _hold(state, "MetricsUnavailable", "no batch-size evidence in the window; holding"), state
    batch_per_pod = batch
    alpha = _alpha(window, state)
    if policy.mode == "on":
        return _forced_on(model, policy, state, batch_per_pod, alpha, now)
    if state.enabled:
        return _while_on(model, policy, state, batch_per_pod, alpha, now)
    return _while_off(model, policy, state, batch_per_pod, alpha, now)


def _alpha(window: Window, state: SpeculationState) -> float | None:
    k = window.num_speculative_tokens or state.k or 1
    rate = window.acceptance_rate if state.enabled else window.counterfactual_acceptance_rate
    return None if rate is None else alpha_from_acceptance(rate, k)


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


def _while_on(model, policy, state, batch, alpha, now):
    if alpha is None:
        return _hold(state, "MetricsUnavailable", "no drafted tokens in the window; holding"), state
    threshold = model.max_batch_for_speculation(alpha)
    seen = f"batch {batch:.1f}, acceptance {alpha:.2f}, speculation pays up to batch {threshold}"
    dwelling = now - state.since < policy.dwell_s
    if alpha < policy.min_acceptance - policy.acceptance_hysteresis:
        if dwelling:
            return _hold(state, "Dwell", f"would turn off (low acceptance); {seen}", alpha, threshold), state
        return _switch(state, False, state.k, "LowAcceptance", f"acceptance {alpha:.2f} < minAcceptanceRate "
                       f"{policy.min_acceptance:g} - {policy.acceptance_hysteresis:g}; {seen}", now, alpha, threshold)
    if batch > threshold * (1 + policy.batch_hysteresis):
        if dwelling:
            return _hold(state, "Dwell", f"would turn off (batch); {seen}", alpha, threshold), state
        return _switch(state, False, state.k, "BatchAboveThreshold", f"batch {batch:.1f} > {threshold} x "
                       f"{1 + policy.batch_hysteresis:g}; {seen}", now, alpha, threshold)
    best = min(model.best_k(batch, alpha), policy.max_k)
    if best >= 1 and best != state.k and not dwelling:
        return _switch(state, True, best, "DepthRetuned", f"k {state.k} -> {best} maximises goodput; {seen}",
                       now, alpha, threshold)
    return _hold(state, "Paying", seen, alpha, threshold), replace(state, probing=False)


def _while_off(model, policy, state, batch, alpha, now):
    dwelling = now - state.since < policy.dwell_s
    if alpha is None:
        threshold = model.max_batch_for_speculation(policy.min_acceptance)
        due = now - state.since >= policy.reprobe_s
        if due and batch < threshold * (1 - policy.batch_hysteresis):
            k = max(1, min(model.best_k(batch, policy.min_acceptance) or 1, policy.max_k))
            return _switch(state, True, k, "Reprobe", f"no counterfactual acceptance while off; probing k={k} at "
                           f"batch {batch:.1f}", now, None, threshold, probing=True)
        return _hold(state, "NoAcceptanceEvidence", f"off; batch {batch:.1f}; next probe after "
                     f"{policy.reprobe_s:g} s off", None, threshold), state
    threshold = model.max_batch_for_speculation(alpha)
    seen = f"batch {batch:.1f}, counterfactual acceptance {alpha:.2f}, speculation pays up to batch {threshold}"
    clears = (alpha >= policy.min_acceptance + policy.acceptance_hysteresis
              and batch < threshold * (1 - policy.batch_hysteresis))
    k = min(model.best_k(batch, alpha), policy.max_k)
    if not clears or k < 1:
        return _hold(state, "NotPaying", seen, alpha, threshold), state
    if dwelling:
        return _hold(state, "Dwell", f"would turn on; {seen}", alpha, threshold), state
    return _switch(state, True, k, "SpeculationPays", f"k={k}; {seen}", now, alpha, threshold)
