"""Policies the simulator compares. Ours call the operator's pure controllers; the baselines model
what peers do.

Scaling: `specfleet` (control.autoscaler), `static-peak` (enough replicas for the peak, always),
`inflight-target` (KubeAI-style: average in-flight requests over a window / a per-replica target),
`saturation` (llm-d / HPA style: HPA's ratio rule on KV-cache usage and queue length).
Speculation: `specfleet` (control.speculation), `spec-always-on`, `spec-always-off`, `spec-batch-table`
(a static batch-size -> k table, as vLLM's batch-size based disabling).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from specfleet.operator.control import autoscaler, coordinator, speculation
from specfleet.operator.capacity import ServiceModel
from specfleet.operator.control.window import Window


@dataclass
class SpecfleetScaler:
    policy: autoscaler.ScalingPolicy
    state: autoscaler.AutoscalerState = field(default_factory=autoscaler.AutoscalerState)
    name: str = "specfleet"

    def decide(self, window: Window | None, model: ServiceModel, current: int, now: float, alpha: float, k: int,
               ready: int | None = None) -> tuple[int, str]:
        decision, self.state = autoscaler.decide(window, model, current, self.policy, self.state, now, alpha, k,
                                                 ready)
        return decision.desired, decision.reason

    @property
    def detect_interval_s(self) -> float:
        return self.policy.detect_interval_s

    def headroom(self, window: Window | None) -> float:
        return autoscaler.headroom(window, self.state, self.policy)

    def detect(self, window: Window | None, model: ServiceModel, current: int, now: float, speculator,
               enabled: bool, k: int, fallback_alpha: float, ready: int | None = None
               ) -> tuple[int, str, tuple[bool, int, str] | None]:
        """Surge detection between two decisions (coordinator.surge): a scale-up, and a switch of speculation
        (enabled, k, reason) when ours controls it and a surge turns it off; else None."""
        ours = isinstance(speculator, SpecfleetSpeculation)
        spec_state = speculator.state if ours else speculation.SpeculationState(enabled, k)
        decided, states = coordinator.surge(window, model, current, ready, self.policy, speculator.policy if ours else None,
                                      coordinator.Controllers(self.state, spec_state), now, fallback_alpha)
        self.state = states.scaling
        switched = decided.speculation
        if ours:
            speculator.state = states.speculation
        scale = decided.scale
        return scale.desired, scale.reason, None if switched is None else (switched.enabled, switched.k,
                                                                           switched.reason)


@dataclass
class StaticScaler:
    replicas: int
    name: str = "static-peak"

    def decide(self, window, model, current, now, alpha, k, ready=None) -> tuple[int, str]:
        return self.replicas, "Static"


# KubeAI's targetRequests as a fraction of the engine's maxNumSeqs (the default baseline's setting), and
# its default scaleDownDelaySeconds.
INFLIGHT_TARGET_FRACTION = 0.7
INFLIGHT_SCALE_DOWN_DELAY_S = 30.0


@dataclass
class InflightScaler:
    """KubeAI: desired = ceil(mean in-flight over the averaging window / targetRequests)."""

    target: float                      # targetRequests: in-flight requests per replica
    min_replicas: int
    max_replicas: int
    average_s: float = 120.0
    scale_down_delay_s: float = INFLIGHT_SCALE_DOWN_DELAY_S
    samples: deque = field(default_factory=deque)
    below_since: float | None = None
    name: str = "inflight-target"

    def decide(self, window, model, current, now, alpha, k, ready=None) -> tuple[int, str]:
        if window is None or window.running is None or window.queue_depth is None:
            return current, "MetricsUnavailable"
        self.samples.append((now, window.running + window.queue_depth))
        while self.samples and self.samples[0][0] < now - self.average_s:
            self.samples.popleft()
        mean = sum(v for _, v in self.samples) / len(self.samples)
        desired = min(max(math.ceil(mean / self.target), self.min_replicas), self.max_replicas)
        if desired >= current:
            self.below_since = None
            return desired, "InFlight"
        self.below_since = now if self.below_since is None else self.below_since
        return (desired, "InFlight") if now - self.below_since >= self.scale_down_delay_s else (current, "Delay")

    @classmethod
    def of_fraction(cls, max_num_seqs: int, min_replicas: int, max_replicas: int,
                    target_fraction: float = INFLIGHT_TARGET_FRACTION, **kw) -> "InflightScaler":
        """targetRequests = `target_fraction` x maxNumSeqs (lower -> more replicas for the same load)."""
        if target_fraction <= 0:
            raise ValueError(f"target_fraction must be > 0, got {target_fraction}")
        return cls(target_fraction * max_num_seqs, min_replicas, max_replicas, **kw)


@dataclass
class SaturationScaler:
    """HPA v2 on two metrics, KV-cache usage (target 0.8) and waiting requests per pod (target 5):
    ratio rule with 10% tolerance, scale-up limited to max(+100%, +4 pods) per period, 300 s
    scale-down stabilization."""

    min_replicas: int
    max_replicas: int
    kv_target: float = 0.8
    queue_target: float = 5.0
    down_s: float = 300.0
    history: deque = field(default_factory=deque)
    name: str = "saturation"

    def decide(self, window, model, current, now, alpha, k, ready=None) -> tuple[int, str]:
        if window is None or window.kv_cache_usage is None or window.queue_depth is None:
            return current, "MetricsUnavailable"
        ready = max(window.pods_scraped, 1)
        ratio = max(window.kv_cache_usage / self.kv_target, window.queue_depth / ready / self.queue_target)
        raw = current if abs(ratio - 1) <= 0.1 else math.ceil(ready * ratio)
        raw = min(max(raw, self.min_replicas), self.max_replicas)
        self.history.append((now, raw))
        while self.history and self.history[0][0] < now - self.down_s:
            self.history.popleft()
        if raw > current:
            return min(raw, max(2 * current, current + 4)), "Saturated"
        return max(min(current, max(r for _, r in self.history)), self.min_replicas), "Stabilized"


@dataclass
class SpecfleetSpeculation:
    policy: speculation.SpeculationPolicy
    state: speculation.SpeculationState
    name: str = "specfleet"

    def decide(self, window: Window | None, model: ServiceModel, now: float, headroom: float = 0.0
               ) -> tuple[bool, int, str]:
        decision, self.state = speculation.decide(window, model, self.policy, self.state, now, headroom)
        return decision.enabled, decision.k, decision.reason


@dataclass
class FixedSpeculation:
    enabled: bool
    k: int
    name: str

    def decide(self, window, model, now, headroom=0.0) -> tuple[bool, int, str]:
        return self.enabled, self.k, "Fixed"


@dataclass
class BatchTableSpeculation:
    """A static batch-size -> k table (no acceptance awareness), like vLLM's batch-size based disabling."""

    max_k: int
    table: tuple[tuple[float, int], ...] = ((16, 4), (64, 2), (128, 1))
    enabled: bool = True
    k: int = 4
    name: str = "spec-batch-table"

    def decide(self, window, model, now, headroom=0.0) -> tuple[bool, int, str]:
        if window is None or window.batch_size_mean is None:
            return self.enabled, self.k, "MetricsUnavailable"
        k = next((min(k, self.max_k) for bound, k in self.table if window.batch_size_mean <= bound), 0)
        self.enabled, self.k = k > 0, max(k, 1)
        return self.enabled, self.k, "Table"


# The knobs `run.simulate(knobs=...)` may set on a peer baseline (the rest keep their defaults).
KNOBS = {"inflight-target": ("target_fraction", "average_s", "scale_down_delay_s", "speculate"),
         "saturation": ("kv_target", "queue_target", "down_s", "speculate")}
# `speculate=0`: the peer runs without speculative decoding (vLLM's default) instead of with our
# speculation controller.

SCALING = ("specfleet", "static-peak", "inflight-target", "saturation")
SPECULATION = ("spec-always-on", "spec-always-off", "spec-batch-table")
POLICIES = SCALING + SPECULATION
