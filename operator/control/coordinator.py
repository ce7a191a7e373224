"""The coordinator of the two pure controllers: the speculation controller and the autoscaler, in the
order the operator (and the simulator) runs them.

An interval: speculation decides first, on the load the autoscaler sizes for (the arrivals plus its
noise headroom), so "free in replicas" means free for the fleet the autoscaler is about to choose; the
autoscaler then sizes for the speculation now in effect.
A surge detected between intervals scales up; when speculating costs replicas at the surge's load it
goes off at once (no dwell) and the surge is sized without it.
"""
from __future__ import annotations

from dataclasses import dataclass

from specfleet.operator.control import autoscaler, speculation
from specfleet.operator.capacity import ServiceModel
from specfleet.operator.control.window import Window
from specfleet.operator.cost import alpha_from_acceptance


@dataclass(frozen=True)
class Controllers:
    """Both controllers' states (speculation None: the service does not speculate)."""

    scaling: autoscaler.AutoscalerState
    speculation: speculation.SpeculationState | None

    @property
    def speculating(self) -> tuple[bool, int]:
        on = self.speculation is not None and self.speculation.enabled
        return on, self.speculation.k if on else 0


@dataclass(frozen=True)
class Decisions:
    scale: autoscaler.ScaleDecision | None          # None: a fixed replica count
    speculation: speculation.SpeculationDecision | None


def interval(window: Window | None, model: ServiceModel, current: int, ready: int | None,
             scaling: autoscaler.ScalingPolicy | None, spec_policy: speculation.SpeculationPolicy | None,
             states: Controllers, now: float, fallback_alpha: float) -> tuple[Decisions, Controllers]:
    """One interval on one window. `scaling` None: fixed replicas (no autoscaler); `fallback_alpha`:
    the acceptance probability assumed while the window measures none."""
    spec_decision, spec_state = None, states.speculation
    if spec_state is not None and spec_policy is not None:
        headroom = autoscaler.headroom(window, states.scaling, scaling) if scaling is not None else 0.0
        spec_decision, spec_state = speculation.decide(window, model, spec_policy, spec_state, now, headroom)
    states = Controllers(states.scaling, spec_state)
    if scaling is None:
        return Decisions(None, spec_decision), states
    on, k = states.speculating
    alpha = alpha_in_effect(window, k, fallback_alpha) if on else 0.0
    scale, scaler_state = autoscaler.decide(window, model, current, scaling, states.scaling, now, alpha, k, ready)
    return Decisions(scale, spec_decision), Controllers(scaler_state, spec_state)


def surge(window: Window | None, model: ServiceModel, current: int, ready: int | None,
          scaling: autoscaler.ScalingPolicy, spec_policy: speculation.SpeculationPolicy | None,
          states: Controllers, now: float, fallback_alpha: float) -> tuple[Decisions, Controllers]:
    """Surge detection between intervals: a scale-up (or Stable), with speculation off when it costs
    replicas at the surge's load (then the surge is sized without it)."""
    on, k = states.speculating
    alpha = alpha_in_effect(window, k, fallback_alpha) if on else 0.0
    scale, scaler_state = autoscaler.detect(window, model, current, scaling, states.scaling, now, alpha, k, ready)
    if not scale.changed or not on or spec_policy is None:
        return Decisions(scale, None), Controllers(scaler_state, states.speculation)
    headroom = autoscaler.headroom(window, states.scaling, scaling)
    spec_decision, spec_state = speculation.on_surge(window, model, spec_policy, states.speculation, now, headroom)
    if spec_decision is None:
        return Decisions(scale, None), Controllers(scaler_state, states.speculation)
    scale, scaler_state = autoscaler.detect(window, model, current, scaling, states.scaling, now, 0.0, 0, ready)
    return Decisions(scale, spec_decision), Controllers(scaler_state, spec_state)


def alpha_in_effect(window: Window | None, k: int, fallback: float) -> float:
    """The per-token acceptance probability the window measured at depth k, else `fallback`."""
    if window is None or window.acceptance_rate is None:
        return fallback
    return alpha_from_acceptance(window.acceptance_rate, window.num_speculative_tokens or k or 1)
