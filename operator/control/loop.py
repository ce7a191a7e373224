"""The pure part of one control interval of one InferenceService: window + model + state -> decisions,
status fields and Events.

`decide_step` runs both controllers on an interval's window (`coordinator.interval`); `detect_step`
runs surge detection on the short window between intervals, which can only scale up
(autoscaler.detect); scale-downs, speculation and status stay with the interval. `ServiceLoop` is the
per-service state both carry from one step to the next (previous scrapes, stabilization history,
speculation state, calibration); `LoopConfig` the intervals, read once when the operator starts.
`observe_budget` folds the pods' SLO counters into the error budget (status, `SLOAtRisk`, burn Events);
`restored_budget` seeds it from the status an earlier operator process wrote (a restart keeps the windows);
`idle_scale` takes a `minReplicas: 0` service to zero after its idle period. `status_patch` turns a
step into the status fields it changes. The I/O around them (pods, scrapes,
the Deployment, the engines' admin API) is `runner.py`.
"""
from __future__ import annotations

import datetime as dt
import os
import re
from dataclasses import dataclass, field, replace
from typing import Mapping

from specfleet.operator import api, planner, status
from specfleet.operator.capacity import ServiceModel
from specfleet.operator.control import autoscaler, coordinator, scale_from_zero, speculation
from specfleet.operator.control import error_budget
from specfleet.operator.control.error_budget import MET, SERVED, BudgetReport, ErrorBudget, FleetCounts
from specfleet.operator.control.window import Scrape, Window

DEFAULT_INTERVAL_S = 15.0
DEFAULT_DETECT_INTERVAL_S = 5.0
MAX_DECISIONS = status.MAX_DECISIONS
SPECULATION_ANNOTATION = "specfleet.io/speculation"


@dataclass(frozen=True)
class LoopConfig:
    """How often the loop looks: `interval_s` between decisions, `detect_interval_s` between surge
    detections (0: off; only when shorter than the interval), `speculation_dwell_s` overrides the
    speculation controller's minimum dwell (tests, demos)."""

    interval_s: float = DEFAULT_INTERVAL_S
    detect_interval_s: float = DEFAULT_DETECT_INTERVAL_S
    speculation_dwell_s: float | None = None
    prometheus_url: str | None = None       # read engine series from this Prometheus (else from each pod)

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ValueError(f"the control interval must be positive, got {self.interval_s:g} s")
        if not 0 < self.detect_interval_s < self.interval_s:
            object.__setattr__(self, "detect_interval_s", 0.0)

    @classmethod
    def from_environment(cls, env: Mapping[str, str] = os.environ) -> "LoopConfig":
        """`SPECFLEET_CONTROL_INTERVAL`, `SPECFLEET_DETECT_INTERVAL`, `SPECFLEET_SPECULATION_DWELL` (seconds),
        `SPECFLEET_PROMETHEUS_URL`."""
        dwell = env.get("SPECFLEET_SPECULATION_DWELL")
        return cls(float(env.get("SPECFLEET_CONTROL_INTERVAL", DEFAULT_INTERVAL_S)),
                   float(env.get("SPECFLEET_DETECT_INTERVAL", DEFAULT_DETECT_INTERVAL_S)),
                   float(dwell) if dwell else None, env.get("SPECFLEET_PROMETHEUS_URL") or None)


@dataclass
class ServiceLoop:
    generation: int
    model: ServiceModel
    autoscaler: autoscaler.AutoscalerState = field(default_factory=autoscaler.AutoscalerState)
    speculation: speculation.SpeculationState | None = None
    prev: dict[str, Scrape] = field(default_factory=dict)
    recent: dict[str, Scrape] = field(default_factory=dict)     # the latest scrape (interval or detection)
    config: LoopConfig = field(default_factory=LoopConfig)
    budget: ErrorBudget = field(default_factory=lambda: ErrorBudget(0.99))
    slo_counts: FleetCounts = field(default_factory=FleetCounts)
    burning: str = ""               # "" | "fast" | "slow": the burn the last interval reported
    idle_since: float | None = None     # start of the current run of windows without requests
    policies: "Policies | None" = None  # the policies of the spec the last step ran on (`_policies`)


@dataclass
class Policies:
    """The controllers' policies made from one spec and config (the same objects), each made on first use
    and kept across the steps that follow: making them cost more than the rest of an uneventful step."""

    spec: api.InferenceServiceSpec
    config: LoopConfig
    scaling: autoscaler.ScalingPolicy | None = None
    speculation: speculation.SpeculationPolicy | None = None

    def scaling_of(self) -> autoscaler.ScalingPolicy:
        if self.scaling is None:
            self.scaling = _scaling(self.spec, self.config)
        return self.scaling

    def speculation_of(self) -> speculation.SpeculationPolicy:
        if self.speculation is None:
            self.speculation = _speculation_policy(self.spec, self.config)
        return self.speculation


def _policies(spec: api.InferenceServiceSpec, st: ServiceLoop) -> Policies:
    if st.policies is None or st.policies.spec is not spec or st.policies.config is not st.config:
        st.policies = Policies(spec, st.config)
    return st.policies


@dataclass
class Step:
    """What one interval decided: the status fields, Events, and what to apply."""

    scale: autoscaler.ScaleDecision | None
    spec: speculation.SpeculationDecision | None
    observed: dict
    conditions: list[api.Condition]
    decisions: list[dict]
    events: list[tuple[str, str, str]]
    pending: int | None = None      # replicas waiting for a node (None: not looked at)
    budget: BudgetReport | None = None


def decide_step(window: Window | None, spec: api.InferenceServiceSpec, plan: planner.Plan, st: ServiceLoop,
                current: int, ready: int, now: float, when: str, unschedulable: tuple[str, ...] = ()) -> Step:
    """The pure part of an interval: both policies on one window, and what to report. `unschedulable`:
    the scheduler's messages of the service's pods that no node has room for (no capacity: a scale-up
    would only add more of them, so it is held)."""
    policies = _policies(spec, st)
    spec_policy = policies.speculation_of() if st.speculation is not None else None
    scaling = policies.scaling_of() if spec.replicas is None else None
    decided, states = coordinator.interval(window, st.model, current, ready, scaling, spec_policy,
                                     coordinator.Controllers(st.autoscaler, st.speculation), now, st.model.min_acceptance)
    st.autoscaler, st.speculation = states.scaling, states.speculation
    scale, spec_decision = _held_for_capacity(decided.scale, unschedulable), decided.speculation
    scale = idle_scale(scale, window, spec, st, current, now)
    decisions, events = _scale_records(scale, when)
    if spec_decision is not None and spec_decision.changed:
        to = f"on k={spec_decision.k}" if spec_decision.enabled else "off"
        decisions.append({"time": when, "kind": "speculation", "from": _spec_from(spec_decision, st), "to": to,
                          "reason": spec_decision.reason})
        events.append(("Normal", "SpeculationOn" if spec_decision.enabled else "SpeculationOff",
                       f"speculation {to} ({spec_decision.reason}): {spec_decision.message}"))
    conds = conditions(window, st.model, st, spec_decision) + [schedulable_condition(current, unschedulable)]
    return Step(scale, spec_decision, observed(window, st.model), conds, decisions, events,
                pending=len(unschedulable))


def _held_for_capacity(scale: autoscaler.ScaleDecision | None,
                       unschedulable: tuple[str, ...]) -> autoscaler.ScaleDecision | None:
    """A scale-up while replicas already wait for a node adds only more waiting pods: hold instead."""
    if scale is None or scale.desired <= scale.current or not unschedulable:
        return scale
    return autoscaler.ScaleDecision(scale.current, scale.current, "Unschedulable",
                                    f"{len(unschedulable)} replica(s) pending, no node has room "
                                    f"({unschedulable[0]}); would scale to {scale.desired}: {scale.message}",
                                    scale.need)


def idle_scale(scale: autoscaler.ScaleDecision | None, window: Window | None, spec: api.InferenceServiceSpec,
               st: ServiceLoop, current: int, now: float) -> autoscaler.ScaleDecision | None:
    """`minReplicas: 0`: to zero once complete windows have shown no request started, running or waiting
    for `idleSeconds`. A window without the evidence (missing series, a pod not scraped) is not idle."""
    auto = spec.autoscaling
    if spec.replicas is None and auto.min_replicas == 0 and current == 0:
        # At zero only held requests wake the service (handlers); the load autoscaler's floor of 1 must not.
        st.idle_since = None
        return autoscaler.ScaleDecision(0, 0, "ScaledToZero", "0 replicas; requests held by the gateway wake it", 0)
    quiet = (window is not None and window.complete and window.requests_per_second == 0
             and window.running == 0 and not window.queue_depth)
    if spec.replicas is not None or auto.min_replicas > 0 or not quiet:
        st.idle_since = None
        return scale
    st.idle_since = now if st.idle_since is None else st.idle_since
    idle_s = scale_from_zero.idle_seconds(spec)
    if current == 0 or now - st.idle_since < idle_s:
        return scale
    return autoscaler.ScaleDecision(current, 0, "Idle", f"no requests for {now - st.idle_since:.0f} s "
                                                        f"(idleSeconds {idle_s}); held requests wake it", 0)


def schedulable_condition(current: int, unschedulable: tuple[str, ...]) -> api.Condition:
    """`Schedulable`: whether every replica found a node; pending ones add no capacity."""
    if not unschedulable:
        return api.Condition("Schedulable", "True", "AllScheduled", "every replica has a node")
    return api.Condition("Schedulable", "False", "Unschedulable",
                         f"{len(unschedulable)} of {current} replicas pending, counted as no capacity: "
                         f"{unschedulable[0]}")


def detect_step(window: Window | None, spec: api.InferenceServiceSpec, st: ServiceLoop, current: int, ready: int,
                now: float, when: str) -> Step | None:
    """The pure part of a detection between intervals: a scale-up on a surge (with speculation off when
    it costs replicas at the surge's load), or None."""
    if spec.replicas is not None or (current == 0 and spec.autoscaling.min_replicas == 0):
        return None
    policies = _policies(spec, st)
    spec_policy = policies.speculation_of() if st.speculation is not None else None
    decided, states = coordinator.surge(window, st.model, current, ready, policies.scaling_of(), spec_policy,
                                  coordinator.Controllers(st.autoscaler, st.speculation), now, st.model.min_acceptance)
    st.autoscaler, st.speculation = states.scaling, states.speculation
    scale, spec_decision = decided.scale, decided.speculation
    if not scale.changed:
        return None
    decisions, events = _scale_records(scale, when)
    if spec_decision is not None:
        decisions.append({"time": when, "kind": "speculation", "from": "on", "to": "off",
                          "reason": spec_decision.reason})
        events.append(("Normal", "SpeculationOff", f"speculation off ({spec_decision.reason}): "
                                                   f"{spec_decision.message}"))
    conds = conditions(window, st.model, st, spec_decision)[1:] if spec_decision is not None else []
    return Step(scale, spec_decision, {}, conds, decisions, events)


def _speculation_policy(spec: api.InferenceServiceSpec, config: LoopConfig) -> speculation.SpeculationPolicy:
    dwell = {} if config.speculation_dwell_s is None else {"dwell_s": config.speculation_dwell_s}
    return speculation.SpeculationPolicy.from_spec(spec.speculation, spec.runtime.engine, spec.autoscaling,
                                                   fixed_replicas=spec.replicas is not None, **dwell)


def _scaling(spec: api.InferenceServiceSpec, config: LoopConfig) -> autoscaler.ScalingPolicy:
    """The load-based policy never goes below 1; only `idle_scale` takes a service to zero."""
    policy = autoscaler.ScalingPolicy.from_spec(spec.autoscaling, detect_interval_s=config.detect_interval_s)
    return replace(policy, min_replicas=max(1, policy.min_replicas))


def _scale_records(scale: autoscaler.ScaleDecision | None, when: str) -> tuple[list[dict], list[tuple]]:
    """The `lastDecisions` entry and the Event of a replica change (none without one)."""
    if scale is None or not scale.changed:
        return [], []
    decision = {"time": when, "kind": "scale", "from": str(scale.current), "to": str(scale.desired),
                "reason": scale.reason}
    event = ("Normal", f"Scale{'Up' if scale.desired > scale.current else 'Down'}",
             f"{scale.current} -> {scale.desired} replicas ({scale.reason}): {scale.message}")
    return [decision], [event]


def _spec_from(decision: speculation.SpeculationDecision, st: ServiceLoop) -> str:
    return "off" if decision.enabled and decision.reason in ("SpeculationPays", "Reprobe") else "on"


def observed(window: Window | None, model: ServiceModel) -> dict:
    if window is None:
        return {}
    out = {"window": f"{window.seconds:.0f}s"}
    values = {"requestsPerSecond": window.requests_per_second, "ttftP99Ms": _ms(window.ttft_p99),
              "itlP99Ms": _ms(window.itl_p99), "sloAttainment": window.slo_attainment(model.ttft_s, model.itl_s),
              "batchSizeMean": window.batch_size_mean,
              "acceptanceRate": window.acceptance_rate if window.acceptance_rate is not None
              else window.counterfactual_acceptance_rate,
              "meanAcceptedLength": window.mean_accepted_length, "queueDepth": window.queue_depth,
              "kvCacheUsage": window.kv_cache_usage}
    out.update({k: round(v, 4) for k, v in values.items() if v is not None})
    return out


def _measured(observed: Mapping) -> dict:
    """`status.observed` without the window's length."""
    return {k: v for k, v in observed.items() if k != "window"}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def conditions(window: Window | None, model: ServiceModel, st: ServiceLoop,
               decision: speculation.SpeculationDecision | None) -> list[api.Condition]:
    out = [_slo_condition(window, model)]
    if decision is not None and st.speculation is not None:
        on = st.speculation.enabled
        out.append(api.Condition("SpeculationActive", "True" if on else "False", decision.reason,
                                 (f"k={st.speculation.k}; " if on else "") + decision.message))
    return out


def _slo_condition(window: Window | None, model: ServiceModel) -> api.Condition:
    if window is None or not window.complete or (window.ttft_p99 is None and window.itl_p99 is None):
        return api.Condition("SLOMet", "Unknown", "MetricsUnavailable", "no complete metrics window with traffic")
    ttft, itl = window.ttft_p99, window.itl_p99
    seen = (f"TTFT p99 {_fmt(ttft)} ms (target {model.ttft_s * 1000:g}), ITL p99 {_fmt(itl)} ms "
            f"(target {model.itl_s * 1000:g}) over {window.seconds:.0f} s")
    met = (ttft is None or ttft <= model.ttft_s) and (itl is None or itl <= model.itl_s)
    return api.Condition("SLOMet", "True" if met else "False", "Observed" if met else "Missed", seen)


def _fmt(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.1f}"


def observe_budget(st: ServiceLoop, scrapes: Mapping[str, Scrape], present: set[str], now: float,
                   objective: float) -> tuple[BudgetReport | None, api.Condition | None, list[tuple[str, str, str]]]:
    """Fold the pods' SLO counters into the error budget: the report (None before any served request),
    the `SLOAtRisk` condition and an Event when a fast or slow burn starts or ends."""
    st.budget.objective = objective
    st.slo_counts.fold({pod: (s.counters[MET], s.counters[SERVED]) for pod, s in scrapes.items()
                        if MET in s.counters and SERVED in s.counters}, present)
    st.budget.observe(now, st.slo_counts.good, st.slo_counts.total)
    report = st.budget.report()
    if not report.attainment:
        return None, None, []
    burning = report.burn
    events = []
    if burning and burning != st.burning:
        events.append(("Warning", f"{burning.capitalize()}Burn", f"error budget at risk: {report.reason}"))
    elif st.burning and not burning:
        events.append(("Normal", "BurnStopped", f"the {st.burning} burn stopped; attainment {report.attainment}"))
    st.burning = burning
    # Only a fast burn sets SLOAtRisk (what pages, and what Argo CD reports Degraded); a slow burn is a
    # ticket: an Event and the reason, status False.
    if burning == "fast":
        cond = api.Condition("SLOAtRisk", "True", "FastBurn", report.reason)
    elif burning == "slow":
        cond = api.Condition("SLOAtRisk", "False", "SlowBurn", report.reason)
    else:
        short = min(report.burn_rate.items(), key=lambda kv: _window_s(kv[0]))
        cond = api.Condition("SLOAtRisk", "False", "WithinBudget",
                             f"burn rate {short[1]:g}x over {short[0]} of a {objective:g} objective")
    return report, cond, events


def restored_budget(old_status: Mapping, objective: float, now_wall: float, now_t: float) -> dict:
    """`ServiceLoop` fields for a service an earlier operator process already watched: the error budget's
    windows seeded from `status.errorBudget`, the fleet counts going on from them, and the burn it last
    reported (so a restart neither forgets the budget nor repeats a burn's Event). Empty without counts."""
    budget = error_budget.restore(old_status.get("errorBudget"), objective, now_wall, now_t)
    if budget is None:
        return {}
    last = budget.samples[-1]
    risk = next((c for c in old_status.get("conditions") or [] if c.get("type") == "SLOAtRisk"), {})
    burning = {"FastBurn": "fast", "SlowBurn": "slow"}.get(risk.get("reason"), "")
    return {"budget": budget, "slo_counts": FleetCounts(good=last.good, total=last.total), "burning": burning}


def restored_speculation(old_status: Mapping, planned: speculation.SpeculationState, generation: int,
                         now_wall: float, now_t: float) -> speculation.SpeculationState:
    """The speculation state an earlier operator process left on the pods (its `SpeculationActive`
    condition, for this generation of the spec): on or off, its depth, and when it last switched, so a
    restart or a leader change neither switches the pods back to the plan nor cuts a dwell short."""
    cond = next((c for c in old_status.get("conditions") or [] if c.get("type") == "SpeculationActive"), None)
    if cond is None or cond.get("observedGeneration") != generation or cond.get("status") not in ("True", "False"):
        return planned
    depth = re.match(r"k=(\d+);", cond.get("message") or "")
    try:
        switched = dt.datetime.fromisoformat(cond["lastTransitionTime"].replace("Z", "+00:00")).timestamp()
    except (KeyError, AttributeError, ValueError):
        switched = None
    since = planned.since if switched is None else now_t - max(0.0, now_wall - switched)
    return replace(planned, enabled=cond["status"] == "True", k=int(depth.group(1)) if depth else planned.k,
                   since=since)


def _window_s(label: str) -> float:
    return float(label[:-1]) * (3600 if label.endswith("h") else 60)


def status_patch(body: dict, step: Step, when: str) -> dict:
    """The status fields a step changes, merged with the CR's current status (conditions, decisions).
    `observed` is left out when no measured value changed: a window's length alone moves with the
    sources' sampling (14 s, 15 s, 30 s), and a write for it would cost every unchanged service a status
    patch and a watch event per interval."""
    old = body.get("status") or {}
    generation = body["metadata"].get("generation", 1)
    patch: dict = {}
    if step.conditions:
        patch["conditions"] = status.merge_conditions(old.get("conditions") or [], step.conditions, when,
                                                          generation)
    if step.observed and (not old.get("observed") or _measured(step.observed) != _measured(old["observed"])):
        patch["observed"] = step.observed
    if step.decisions:
        patch["lastDecisions"] = ((old.get("lastDecisions") or []) + step.decisions)[-MAX_DECISIONS:]
    if step.scale is not None:
        patch["desiredReplicas"] = step.scale.desired
    if step.pending is not None:
        patch["replicasPending"] = step.pending
    if step.budget is not None:
        patch["errorBudget"] = step.budget.as_status(when)
    return patch
