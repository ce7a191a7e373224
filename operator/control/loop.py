"""One control interval of one InferenceService: discover pods, scrape, window, decide, apply, report.

`decide_step` is pure (window + model + state -> decisions, status fields, Events); `run_once` is the
I/O around it, called by the kopf timer in `handlers.py`. Between two intervals a second, shorter timer
(`SPECFLEET_DETECT_INTERVAL`, default 5 s) runs `run_detect`: one more scrape and `detect_step`, which
can only scale up on a surge (autoscaler.detect); scale-downs, speculation and status stay with the
interval. The two hold a per-service lock, so neither acts on a replica count the other is changing.
Per-service state (previous scrapes, stabilization history, speculation state, calibration) lives in
`LOOPS` in this process; after an operator restart it is rebuilt from the Deployment and the first two
scrapes.

Decisions are applied to the Deployment's `spec.replicas` (never the CR spec) and, for speculation,
live through `POST /admin/speculation` on every ready pod (specfleet runtime, bearer token from the
`<name>-admin` Secret) or through the `specfleet.io/speculation` annotation on the Deployment, which
the reconciler renders into the engine args: a rolling update (vllm runtime).

Pod endpoints come from the Pods' IPs, or, where no kubelet runs pods (the API emulator, tests), from
the JSON file named by `SPECFLEET_POD_ENDPOINTS_FILE`: `{"namespace/name": {"pod": "http://host:port"}}`.
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import time
from dataclasses import dataclass, field, replace

from specfleet.operator import api, catalogs, planner, render
from specfleet.operator.control import autoscaler, joint, speculation, telemetry
from specfleet.operator.control.calibration import ServiceModel, recalibrate, service_model
from specfleet.operator.control.window import Scrape, Window, build_window
from specfleet.operator.metrics_source import scrape_pods, set_speculation

log = logging.getLogger("specfleet.operator.control")
DEFAULT_INTERVAL_S = 15.0
DEFAULT_DETECT_INTERVAL_S = 5.0
MAX_DECISIONS = 20
SPECULATION_ANNOTATION = "specfleet.io/speculation"


def interval_s() -> float:
    return float(os.environ.get("SPECFLEET_CONTROL_INTERVAL", DEFAULT_INTERVAL_S))


def detect_interval_s() -> float:
    """Seconds between surge detections; 0 (off) when set to 0 or not shorter than the interval."""
    value = float(os.environ.get("SPECFLEET_DETECT_INTERVAL", DEFAULT_DETECT_INTERVAL_S))
    return value if 0 < value < interval_s() else 0.0


def _dwell() -> dict:
    """`SPECFLEET_SPECULATION_DWELL` (seconds) overrides the minimum dwell time (tests, demos)."""
    value = os.environ.get("SPECFLEET_SPECULATION_DWELL")
    return {"dwell_s": float(value)} if value else {}


@dataclass
class ServiceLoop:
    generation: int
    model: ServiceModel
    autoscaler: autoscaler.AutoscalerState = field(default_factory=autoscaler.AutoscalerState)
    speculation: speculation.SpeculationState | None = None
    prev: dict[str, Scrape] = field(default_factory=dict)
    recent: dict[str, Scrape] = field(default_factory=dict)     # the latest scrape (interval or detection)


@dataclass
class Step:
    """What one interval decided: the status fields, Events, and what to apply."""

    scale: autoscaler.ScaleDecision | None
    spec: speculation.SpeculationDecision | None
    observed: dict
    conditions: list[api.Condition]
    decisions: list[dict]
    events: list[tuple[str, str, str]]


LOOPS: dict[tuple[str, str], ServiceLoop] = {}
LOCKS: dict[tuple[str, str], asyncio.Lock] = {}


def decide_step(window: Window | None, spec: api.InferenceServiceSpec, plan: planner.Plan, st: ServiceLoop,
                current: int, ready: int, now: float, when: str) -> Step:
    """The pure part of an interval: both policies on one window, and what to report."""
    spec_policy = _speculation_policy(spec) if st.speculation is not None else None
    scaling = _scaling(spec) if spec.replicas is None else None
    decided, states = joint.interval(window, st.model, current, ready, scaling, spec_policy,
                                     joint.Controllers(st.autoscaler, st.speculation), now, st.model.min_acceptance)
    st.autoscaler, st.speculation = states.scaling, states.speculation
    scale, spec_decision = decided.scale, decided.speculation
    decisions, events = _scale_records(scale, when)
    if spec_decision is not None and spec_decision.changed:
        to = f"on k={spec_decision.k}" if spec_decision.enabled else "off"
        decisions.append({"time": when, "kind": "speculation", "from": _spec_from(spec_decision, st), "to": to,
                          "reason": spec_decision.reason})
        events.append(("Normal", "SpeculationOn" if spec_decision.enabled else "SpeculationOff",
                       f"speculation {to} ({spec_decision.reason}): {spec_decision.message}"))
    return Step(scale, spec_decision, observed(window, st.model), conditions(window, st.model, st, spec_decision),
                decisions, events)


def detect_step(window: Window | None, spec: api.InferenceServiceSpec, st: ServiceLoop, current: int, ready: int,
                now: float, when: str) -> Step | None:
    """The pure part of a detection between intervals: a scale-up on a surge (with speculation off when
    it costs replicas at the surge's load), or None."""
    if spec.replicas is not None:
        return None
    spec_policy = _speculation_policy(spec) if st.speculation is not None else None
    decided, states = joint.surge(window, st.model, current, ready, _scaling(spec), spec_policy,
                                  joint.Controllers(st.autoscaler, st.speculation), now, st.model.min_acceptance)
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


def _speculation_policy(spec: api.InferenceServiceSpec) -> speculation.SpeculationPolicy:
    return speculation.SpeculationPolicy.from_spec(spec.speculation, spec.runtime.engine, spec.autoscaling,
                                                   fixed_replicas=spec.replicas is not None, **_dwell())


def _scaling(spec: api.InferenceServiceSpec) -> autoscaler.ScalingPolicy:
    return autoscaler.ScalingPolicy.from_spec(spec.autoscaling, detect_interval_s=detect_interval_s())


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
    return "off" if decision.enabled and decision.reason in ("SpeculationPays", "Reprobe") else (
        "on" if not decision.enabled else "on")


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


# -- I/O --------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    status: dict
    events: list[tuple[str, str, str]]


def _lock(ns: str, name: str) -> asyncio.Lock:
    return LOCKS.setdefault((ns, name), asyncio.Lock())


async def run_once(body: dict, kube, when: str, clock=time.monotonic) -> Outcome | None:
    """One interval for one InferenceService; None when there is nothing to control yet."""
    async with _lock(body["metadata"]["namespace"], body["metadata"]["name"]):
        return await _interval(body, kube, when, clock)


async def run_detect(body: dict, kube, when: str, clock=time.monotonic) -> Outcome | None:
    """One surge detection between intervals; None unless it scaled up (or before the first interval)."""
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    try:
        spec = api.parse_spec(body.get("spec") or {})
    except api.SpecError:
        return None
    async with _lock(ns, name):
        st = LOOPS.get((ns, name))
        if st is None or st.generation != meta.get("generation", 1) or spec.replicas is not None:
            return None
        deployment = await asyncio.to_thread(kube.get, "Deployment", ns, name)
        if deployment is None:
            return None
        current = (deployment.get("spec") or {}).get("replicas", 0)
        step = await _detect(kube, ns, name, spec, st, deployment, clock, when)
    if step is None:
        return None
    telemetry.DESIRED.labels(ns, name).set(step.scale.desired)
    telemetry.DECISIONS.labels(ns, name, "scale", step.scale.reason).inc()
    return Outcome(_status(body, step, when, current), step.events)


async def _detect(kube, ns: str, name: str, spec, st: ServiceLoop, deployment: dict, clock, when: str) -> Step | None:
    """Scrape, build the short window since the latest scrape, and apply a scale-up if there is one."""
    endpoints = await asyncio.to_thread(pod_endpoints, kube, ns, name)
    scrapes = await scrape_pods(endpoints) if endpoints else {}
    window = build_window(st.recent, scrapes, expected=len(endpoints))
    st.recent = {**{p: s for p, s in st.recent.items() if p in endpoints}, **scrapes}
    current = (deployment.get("spec") or {}).get("replicas", 0)
    ready = ((deployment.get("status") or {}).get("readyReplicas")) or 0
    step = detect_step(window, spec, st, current, ready, clock(), when)
    if step is not None:
        await _apply(kube, {"metadata": {"namespace": ns, "name": name}}, spec, step, st, endpoints, scrapes)
    return step


async def _interval(body: dict, kube, when: str, clock) -> Outcome | None:
    meta = body["metadata"]
    name, ns, generation = meta["name"], meta["namespace"], meta.get("generation", 1)
    try:
        spec = api.parse_spec(body.get("spec") or {})
    except api.SpecError:
        return None
    plan = planner.plan(spec, catalogs.gpus(), catalogs.models())
    deployment = await asyncio.to_thread(kube.get, "Deployment", ns, name)
    if isinstance(plan, planner.Infeasible) or deployment is None:
        return None
    st = _state(ns, name, generation, spec, plan)
    if st is None:
        return None
    current = (deployment.get("spec") or {}).get("replicas", 0)
    ready = ((deployment.get("status") or {}).get("readyReplicas")) or 0
    endpoints = await asyncio.to_thread(pod_endpoints, kube, ns, name)
    scrapes = await scrape_pods(endpoints) if endpoints else {}
    window = build_window(st.prev, scrapes, expected=len(endpoints))
    st.prev = {**{p: s for p, s in st.prev.items() if p in endpoints}, **scrapes}
    st.recent = dict(st.prev)
    if window is not None and window.complete and st.speculation is not None:
        st.model = recalibrate(st.model, window.steps, st.speculation.k)
    step = decide_step(window, spec, plan, st, current, ready, clock(), when)
    await _apply(kube, body, spec, step, st, endpoints, scrapes)
    _record_metrics(ns, name, spec, plan, step, ready, window, st)
    return Outcome(_status(body, step, when, current), step.events)


def _state(ns: str, name: str, generation: int, spec, plan) -> ServiceLoop | None:
    st = LOOPS.get((ns, name))
    if st is not None and st.generation == generation:
        return st
    model = service_model(spec, plan, catalogs.gpus(), catalogs.models())
    if model is None:
        return None
    sp = plan.speculation
    spec_state = speculation.SpeculationState(sp.enabled, sp.k) if sp.method is not None and sp.k > 0 else None
    if st is not None:        # a spec edit: keep the scrapes and the scaling history, re-plan the rest
        st = replace(st, generation=generation, model=model, speculation=spec_state)
    else:
        st = ServiceLoop(generation, model, speculation=spec_state)
    LOOPS[(ns, name)] = st
    return st


def forget(ns: str, name: str) -> None:
    LOOPS.pop((ns, name), None)
    LOCKS.pop((ns, name), None)


def pod_endpoints(kube, ns: str, name: str) -> dict[str, str]:
    """`{pod: base_url}` of the service's ready pods (or the override file's entry)."""
    override = os.environ.get("SPECFLEET_POD_ENDPOINTS_FILE")
    if override:
        try:
            return dict(json.loads(open(override, encoding="utf-8").read()).get(f"{ns}/{name}", {}))
        except (OSError, ValueError):
            log.warning("cannot read %s", override)
            return {}
    pods = kube.core.list_namespaced_pod(ns, label_selector=render.selector_string(name), _preload_content=False)
    out = {}
    for pod in json.loads(pods.data).get("items", []):
        st = pod.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])
        if ready and st.get("podIP") and not pod["metadata"].get("deletionTimestamp"):
            out[pod["metadata"]["name"]] = f"http://{st['podIP']}:{render.PORT}"
    return out


def admin_token(kube, ns: str, name: str) -> str | None:
    secret = kube.get("Secret", ns, render.admin_secret_name(name))
    if secret is None:
        return None
    if (secret.get("data") or {}).get("token"):
        return base64.b64decode(secret["data"]["token"]).decode()
    return (secret.get("stringData") or {}).get("token")


async def _apply(kube, body, spec, step: Step, st: ServiceLoop, endpoints, scrapes) -> None:
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    if step.scale is not None and step.scale.changed:
        await asyncio.to_thread(kube.apps.patch_namespaced_deployment, name, ns,
                                {"spec": {"replicas": step.scale.desired}}, _preload_content=False)
    if st.speculation is None:
        return
    if spec.runtime.engine == "vllm":
        if step.spec is not None and step.spec.changed:
            value = f"enabled={str(st.speculation.enabled).lower()},k={st.speculation.k}"
            await asyncio.to_thread(kube.apps.patch_namespaced_deployment, name, ns,
                                    {"metadata": {"annotations": {SPECULATION_ANNOTATION: value}}},
                                    _preload_content=False)
        return
    stale = [pod for pod, s in scrapes.items() if _disagrees(s, st.speculation)]
    targets = list(endpoints) if step.spec is not None and step.spec.changed else stale
    if not targets:
        return
    token = await asyncio.to_thread(admin_token, kube, ns, name)
    results = await asyncio.gather(*(set_speculation(endpoints[p], st.speculation.enabled, st.speculation.k, token)
                                     for p in targets), return_exceptions=True)
    for pod, result in zip(targets, results):
        if isinstance(result, Exception):
            log.warning("speculation switch on %s/%s pod %s failed: %s", ns, name, pod, result)
            step.events.append(("Warning", "SpeculationSwitchFailed", f"pod {pod}: {result}"))


def _disagrees(scrape: Scrape, state: speculation.SpeculationState) -> bool:
    on = scrape.gauges.get("specfleet:speculation_enabled")
    k = scrape.gauges.get("specfleet:num_speculative_tokens")
    if on is None:
        return False
    return bool(on) != state.enabled or (state.enabled and k is not None and int(k) != state.k)


def _status(body: dict, step: Step, when: str, current: int) -> dict:
    from specfleet.operator import status as status_mod

    old = body.get("status") or {}
    generation = body["metadata"].get("generation", 1)
    patch: dict = {}
    if step.conditions:
        patch["conditions"] = status_mod.merge_conditions(old.get("conditions") or [], step.conditions, when,
                                                          generation)
    if step.observed:
        patch["observed"] = step.observed
    if step.decisions:
        patch["lastDecisions"] = ((old.get("lastDecisions") or []) + step.decisions)[-MAX_DECISIONS:]
    if step.scale is not None:
        patch["desiredReplicas"] = step.scale.desired
    return patch


def _record_metrics(ns, name, spec, plan, step: Step, ready: int, window: Window | None, st: ServiceLoop) -> None:
    t = telemetry
    labels = (ns, name)
    if step.scale is not None:
        t.DESIRED.labels(*labels).set(step.scale.desired)
        t.DECISIONS.labels(*labels, "scale", step.scale.reason).inc()
    if step.spec is not None:
        t.DECISIONS.labels(*labels, "speculation", step.spec.reason).inc()
    t.ACTUAL.labels(*labels).set(ready)
    t.PREDICTED.labels(*labels, "ttft").set(plan.predicted.ttft_p99_ms / 1000)
    t.PREDICTED.labels(*labels, "itl").set(plan.predicted.itl_p99_ms / 1000)
    t.TARGET.labels(*labels, "ttft").set(spec.slo.ttft_p99_ms / 1000)
    t.TARGET.labels(*labels, "itl").set(spec.slo.itl_p99_ms / 1000)
    if st.speculation is not None:
        t.SPECULATION.labels(*labels).set(float(st.speculation.enabled))
        t.SPEC_K.labels(*labels).set(st.speculation.k)
    if window is None:
        return
    for metric, value in (("ttft", window.ttft_p99), ("itl", window.itl_p99)):
        if value is not None:
            t.OBSERVED.labels(*labels, metric).set(value)
    attainment = window.slo_attainment(st.model.ttft_s, st.model.itl_s)
    if attainment is not None:
        t.ATTAINMENT.labels(*labels).set(attainment)
    acceptance = window.acceptance_rate if window.acceptance_rate is not None else window.counterfactual_acceptance_rate
    if acceptance is not None:
        t.ACCEPTANCE.labels(*labels).set(acceptance)
