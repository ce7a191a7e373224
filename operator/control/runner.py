"""The I/O of one InferenceService's control loop (`scheduler.py` decides when it runs).

`ServiceControl` holds the service's state (kept in its kopf `memo`): the plan of the current
generation (planned once per generation, not per interval) and the `ServiceLoop` of the pure steps.
Each interval it takes the service's engine pods and its Deployment's replica counts as the watches
report them (`discovery.EngineView`: no API call), scrapes the serving pods, runs `loop.decide_step`,
applies the decision through the `Kube` interface (the Deployment's `spec.replicas`, never the CR spec;
before a scale-down the pods to remove are marked with `controller.kubernetes.io/pod-deletion-cost`;
speculation through `POST /admin/speculation` on every ready pod with the `<name>-admin` Secret's bearer
token, or the `specfleet.io/speculation` annotation the reconciler renders into the vllm args) and
returns the status patch and Events (with the error budget folded from the pods' SLO counters).
Between intervals `detect` scrapes again for a surge (scale-ups only); a detection whose scrape holds no
sample newer than the last one (Prometheus samples at its own pace) has no new evidence and stops there.

A service with no pods and nothing scraped before is idle: a step costs a list lookup and no I/O.
After an operator restart the state is rebuilt from the Deployment and the first two scrapes; the error
budget's windows are seeded from the status the previous process wrote (`loop.restored_budget`).
"""
from __future__ import annotations

import asyncio
import base64
import datetime as dt
import functools
import logging
import time
from dataclasses import dataclass, replace
from typing import Callable

import httpx

from specfleet.operator import api, capacity, catalogs, model_folder, plan_pinning, planner, render, status
from specfleet.operator.control import discovery, loop, profile_host, scale_down, speculation, telemetry
from specfleet.operator.cost import ProfileCost, recalibrate_from
from specfleet.operator.control.discovery import EnginePod
from specfleet.operator.control.window import Scrape, Window, build_window
from specfleet.operator.control.sources import DirectSource, PrometheusSource, SourceReport
from specfleet.operator.control.speculation_switch import set_speculation
from specfleet.operator.threads import in_control_thread

log = logging.getLogger("specfleet.operator.control")
AWAIT_SAMPLES_INTERVALS = 4       # at the default 15 s: a minute, the Prometheus source's staleness bound


@dataclass
class ControlOutcome:
    """What one control step reports: the status fields it changes and (type, reason, message) Events."""

    status: dict
    events: list[tuple[str, str, str]]


@dataclass(frozen=True)
class Planned:
    """The plan of one generation of the spec (plan None: invalid or infeasible, nothing to control)."""

    generation: int
    spec: api.InferenceServiceSpec | None
    plan: planner.Plan | None
    profiles: tuple[ProfileCost, ...] = ()      # every usable profile of the pair, one per host measured
    replanned: str = ""                         # status.replanned: a `specfleet.io/replan` the reconcile honoured


def _usable_profiles(spec: api.InferenceServiceSpec) -> tuple[ProfileCost, ...]:
    """Every profile of the service's (model, accelerator) that may price it, whatever its host."""
    gpu, models = catalogs.gpus().get(spec.accelerator.type), catalogs.models()
    entries = catalogs.profiles().variants(spec.model, spec.accelerator.type) if gpu is not None else ()
    return tuple(cost for entry in entries if (cost := planner.usable_profile(entry, spec, gpu, models)[0]))


def now_iso() -> str:
    """The wall clock to the second, as status and Events write it (formatted once a second: a fleet's
    steps ask hundreds of times a second)."""
    return _iso_second(int(time.time()))


@functools.lru_cache(maxsize=1)
def _iso_second(second: int) -> str:
    return dt.datetime.fromtimestamp(second, dt.timezone.utc).isoformat().replace("+00:00", "Z")


class ServiceControl:
    """The control loop of one InferenceService: its state, and each step's I/O through `kube`."""

    def __init__(self, namespace: str, name: str, kube, config: loop.LoopConfig,
                 http: httpx.AsyncClient | None = None, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, source: DirectSource | PrometheusSource | None = None):
        """`http`: the operator's one HTTP client for scrapes and speculation switches (making a client
        costs tens of milliseconds of CPU; None: one per call). `wall`: the wall clock, for the age of the
        error budget a previous operator process left in status. `source`: where engine series come from
        (`control/sources.py`; the operator's one source, shared by every service; None: each pod directly)."""
        self.namespace, self.name, self.kube, self.config, self.clock = namespace, name, kube, config, clock
        self.wall = wall
        self.http = http
        self.source = source or DirectSource(http)
        self.last_step = float("-inf")
        self.awaiting = False           # the last interval stopped to wait for a pod's next sample
        self.planned: Planned | None = None
        self.state: loop.ServiceLoop | None = None
        self._metrics: telemetry.ServiceMetrics | None = None

    @property
    def metrics(self) -> telemetry.ServiceMetrics:
        """The service's own metrics, made at its first step (an idle service never makes them)."""
        if self._metrics is None:
            self._metrics = telemetry.ServiceMetrics(self.namespace, self.name)
        return self._metrics

    def idle(self, pods: list[EnginePod]) -> bool:
        """Nothing to observe: no pods, and no earlier scrape whose disappearance would be news."""
        return not pods and (self.state is None or not self.state.prev)

    def news(self, pods: list[EnginePod], interval: bool) -> bool | None:
        """Whether a step now would find, for every pod, a sample newer than the one it last read (True) or
        for none (False); None where the source cannot tell without I/O (`source.news`). A detection reads
        past the last look, an interval past the last interval; an interval that may no longer wait
        (`_awaiting_samples`) is never told False. The scheduler takes the turns with nothing new in place:
        most, at Prometheus's pace (a pod sampled once per 15 s, looked at every 5 s)."""
        st = self.state
        if st is None:
            return None
        found = self.source.news(self.namespace, discovery.endpoints(pods), st.prev if interval else st.recent)
        return None if found is False and interval and not self._may_wait() else found

    async def interval(self, body: dict, pods: list[EnginePod], replicas: Replicas | None,
                       when: str) -> ControlOutcome | None:
        """One interval; None when there is nothing to control (idle, no plan, no Deployment). `replicas`:
        the Deployment's (spec.replicas, readyReplicas) as the watch last reported them."""
        self.awaiting = False
        if self.idle(pods) or replicas is None or (planned := self._planned(body)).plan is None:
            return None
        st, spec, plan = self.state, planned.spec, planned.plan
        current, ready = replicas
        endpoints = discovery.endpoints(pods)
        scrapes, report = await self.source.scrape(self.namespace, endpoints)
        if self._awaiting_samples(scrapes):
            self.awaiting = True
            return None
        self.last_step = self.clock()
        window = build_window(st.prev, scrapes, expected=len(endpoints))
        previous = st.prev
        st.prev = {**{p: s for p, s in st.prev.items() if p in endpoints}, **scrapes}
        st.recent = dict(st.prev)
        host_events, host_conditions = self._priced_for_hosts(scrapes, planned, body)
        if window is not None and window.complete and st.speculation is not None:
            st.model = recalibrate_from(st.model, window, st.speculation.k)
        waiting = tuple(p.unschedulable for p in discovery.unschedulable(pods))
        step = loop.decide_step(window, spec, plan, st, current, ready, self.clock(), when, waiting)
        if not previous:
            # The first scrape round (a new loop, or a restarted operator) has no window yet: leave SLOMet
            # as it stands rather than flip it to Unknown for one interval.
            step.conditions = [c for c in step.conditions if c.type != "SLOMet"]
        step.budget, at_risk, events = loop.observe_budget(st, scrapes, set(endpoints), self.clock(),
                                                           spec.slo.objective)
        step.conditions += ([at_risk] if at_risk is not None else []) + [source_condition(report)] + host_conditions
        step.events += events + host_events
        if step.scale is not None and step.scale.changed and step.scale.desired < step.scale.current:
            step.events += await self._mark_for_deletion(pods, scrapes, previous, step.scale.desired)
        await self._apply(spec, step, endpoints, scrapes)
        _record_metrics(self.metrics, spec, plan, step, ready, window, st)
        for source in ("prometheus", "direct"):
            self.metrics.set(telemetry.METRICS_SOURCE, float(source == report.source), source)
        old = body.get("status") or {}
        calibration = effective_patch(old.get("calibration") or {}, status.calibration_dict(st.model.calibration))
        return ControlOutcome({**loop.status_patch(body, step, when), "calibration": calibration}, step.events)

    def _priced_for_hosts(self, scrapes: dict[str, Scrape], planned: Planned,
                          body: dict) -> tuple[list[tuple[str, str, str]], list[api.Condition]]:
        """Price the service with the profile of the CPU its engines report (`profile_host`): the Event of a
        change, and the Degraded condition the check sets or clears."""
        chosen = profile_host.pricing(planned.plan.profile, planned.profiles, profile_host.engine_hosts(scrapes))
        if chosen is None:
            return [], []
        before = self.state.model
        self.state.model = profile_host.repriced(before, chosen)
        event = profile_host.change_event(before, self.state.model, chosen)
        condition = status.host_degraded((body.get("status") or {}).get("conditions") or [], chosen.mismatch)
        return [event] if event else [], [condition] if condition else []

    def _awaiting_samples(self, scrapes: dict[str, Scrape]) -> bool:
        """Whether to wait for a pod's next sample before stepping: Prometheus samples at its own pace, so an
        interval can come before a pod's next scrape; a window without it would be incomplete, and an
        incomplete window reads as missing evidence (SLOMet Unknown, an idle period restarted). A direct
        scrape is always new. The scheduler tries the interval again soon (`awaiting`), so intervals follow
        the samples' pace; waiting ends after `AWAIT_SAMPLES_INTERVALS` intervals, or the source's staleness
        bound if longer (`_may_wait`): then the step runs on what there is."""
        prev = self.state.prev
        stale = any(pod in prev and s.time <= prev[pod].time for pod, s in scrapes.items())
        return stale and self._may_wait()

    def _may_wait(self) -> bool:
        """At least `AWAIT_SAMPLES_INTERVALS` intervals, and as long as the source still serves a pod's last
        sample (its `stale_after_s`; then it scrapes the pod directly, always a new sample): with a control
        interval shorter than a quarter of Prometheus's scrape interval, four intervals can end before the
        next sample, and a step on the old one (no window) restarts the idle period scale-to-zero counts."""
        bound = max(AWAIT_SAMPLES_INTERVALS * self.config.interval_s, self.source.stale_after_s)
        return self.clock() - self.last_step < bound

    async def detect(self, body: dict, pods: list[EnginePod], replicas: Replicas | None,
                     when: str) -> ControlOutcome | None:
        """One surge detection between intervals; None unless it scaled up (or before the first interval)."""
        planned, st = self.planned, self.state
        if (self.idle(pods) or replicas is None or st is None or planned is None or planned.plan is None
                or planned.generation != _generation(body) or planned.spec.replicas is not None):
            return None
        endpoints = discovery.endpoints(pods)
        if not endpoints or discovery.unschedulable(pods):      # replicas already wait for a node: no more
            return None
        current, ready = replicas
        scrapes, _ = await self.source.scrape(self.namespace, endpoints)
        window = build_window(st.recent, scrapes, expected=len(endpoints))
        st.recent = {**{p: s for p, s in st.recent.items() if p in endpoints}, **scrapes}
        if window is None:      # no pod sampled since the last look (Prometheus's pace): no new evidence
            return None
        step = loop.detect_step(window, planned.spec, st, current, ready, self.clock(), when)
        if step is None:
            return None
        await self._apply(planned.spec, step, endpoints, scrapes)
        self.metrics.set(telemetry.DESIRED, step.scale.desired)
        self.metrics(telemetry.DECISIONS, "scale", step.scale.reason).inc()
        return ControlOutcome(loop.status_patch(body, step, when), step.events)

    def _planned(self, body: dict) -> Planned:
        """The plan of the body's generation: planned once per generation and `specfleet.io/replan` the
        reconcile honoured; a spec edit keeps the scrapes and the scaling history and re-plans the rest."""
        generation, replanned = _generation(body), str((body.get("status") or {}).get("replanned") or "")
        if self.planned is not None and (self.planned.generation, self.planned.replanned) == (generation, replanned):
            return self.planned
        self.planned = Planned(generation, None, None, replanned=replanned)
        try:
            spec = api.parse_spec(body.get("spec") or {})
        except api.SpecError:
            return self.planned
        if spec.plan_only:                  # nothing of ours to control (a leftover workload is left alone)
            return self.planned
        spec = model_folder.with_folder_architecture(spec, catalogs.models())
        plan = plan_pinning.kept_plan(spec, body.get("status") or {}, generation)
        model = capacity.service_model(spec, plan, catalogs.gpus(), catalogs.models()) \
            if isinstance(plan, planner.Plan) else None
        if model is None:
            return self.planned
        sp = plan.speculation
        spec_state = speculation.SpeculationState(sp.enabled, sp.k) if sp.method is not None and sp.k > 0 else None
        if self.state is not None:
            self.state = replace(self.state, generation=generation, model=model, speculation=spec_state)
        else:
            old_status = body.get("status") or {}
            seeded = loop.restored_budget(old_status, spec.slo.objective, self.wall(), self.clock())
            if spec_state is not None:
                spec_state = loop.restored_speculation(old_status, spec_state, generation, self.wall(), self.clock())
            self.state = loop.ServiceLoop(generation, model, speculation=spec_state, config=self.config, **seeded)
        self.planned = Planned(generation, spec, plan, _usable_profiles(spec), replanned)
        return self.planned

    async def before_spec_scale_down(self, pods: list[EnginePod], desired: int) -> list[tuple[str, str, str]]:
        """A scale-down the spec asks for (a fixed `replicas` lowered, `kubectl scale`): scrape the pods now
        and mark the least loaded to go, as the autoscaler's own scale-downs do. Returns the Events."""
        endpoints = discovery.endpoints(pods)
        scrapes, _ = await self.source.scrape(self.namespace, endpoints)
        previous = self.state.prev if self.state is not None else {}
        return await self._mark_for_deletion(pods, scrapes, previous, desired)

    async def _mark_for_deletion(self, pods: list[EnginePod], scrapes: dict[str, Scrape],
                                 previous: dict[str, Scrape], desired: int) -> list[tuple[str, str, str]]:
        """Before a scale-down: rank the pods (`scale_down`) and set their pod-deletion-cost, so the
        ReplicaSet removes the least loaded. A failed annotation is reported; the scale-down goes on."""
        loads = scale_down.loads([p.name for p in pods], scrapes, previous)
        remove = max(0, len(pods) - desired)
        costs = scale_down.deletion_costs(loads, remove)
        results = await asyncio.gather(*(in_control_thread(self.kube.annotate, "Pod", self.namespace, pod,
                                                           {scale_down.DELETION_COST: str(cost)})
                                         for pod, cost in costs.items()), return_exceptions=True)
        failed = [(pod, r) for pod, r in zip(costs, results) if isinstance(r, Exception)]
        for pod, exc in failed:
            log.warning("pod-deletion-cost on %s/%s failed: %s", self.namespace, pod, exc)
        chosen = scale_down.choose(loads, remove)
        described = ", ".join(f"{p.pod} ({'not scraped' if p.in_flight is None else f'{p.in_flight:g} in flight'})"
                              for p in chosen)
        if failed:
            return [("Warning", "DeletionCostFailed",
                     f"could not mark {', '.join(p for p, _ in failed)}: {failed[0][1]}")]
        return [("Normal", "PodsChosen", f"scale-down removes the least loaded first: {described}")] if chosen else []

    async def _apply(self, spec: api.InferenceServiceSpec, step: loop.Step, endpoints: dict[str, str],
                     scrapes: dict[str, Scrape]) -> None:
        ns, name, st = self.namespace, self.name, self.state
        if step.scale is not None and step.scale.changed:
            await in_control_thread(self.kube.scale, "Deployment", ns, name, step.scale.desired)
        if st.speculation is None:
            return
        if spec.runtime.engine == "vllm":
            if step.spec is not None and step.spec.changed:
                value = f"enabled={str(st.speculation.enabled).lower()},k={st.speculation.k}"
                await in_control_thread(self.kube.annotate, "Deployment", ns, name,
                                        {loop.SPECULATION_ANNOTATION: value})
            return
        stale = [pod for pod, s in scrapes.items() if _disagrees(s, st.speculation)]
        targets = list(endpoints) if step.spec is not None and step.spec.changed else stale
        if not targets:
            return
        token = await in_control_thread(admin_token, self.kube, ns, name)
        results = await asyncio.gather(*(set_speculation(endpoints[p], st.speculation.enabled, st.speculation.k,
                                                         token, client=self.http) for p in targets),
                                       return_exceptions=True)
        for pod, result in zip(targets, results):
            if isinstance(result, Exception):
                log.warning("speculation switch on %s/%s pod %s failed: %s", ns, name, pod, result)
                step.events.append(("Warning", "SpeculationSwitchFailed", f"pod {pod}: {result}"))


Replicas = tuple[int, int]          # a Deployment's (spec.replicas, status.readyReplicas)


def source_condition(report: SourceReport) -> api.Condition:
    """`MetricsSource`: True while the configured source serves every pod, False while pods fall back."""
    return api.Condition("MetricsSource", "True" if report.preferred else "False", report.reason, report.message)


def effective_patch(old: dict, patch: dict) -> dict:
    """`patch` without the nulls that delete keys `old` does not have (no-ops in a merge patch). The status
    written keeps no null, so a patch holding one would differ from it at every comparison: every interval
    of every service wrote an unchanged status (`calibration`'s unset `profile` and `fitError`)."""
    return {k: effective_patch(old[k] if isinstance(old.get(k), dict) else {}, v) if isinstance(v, dict) else v
            for k, v in patch.items() if v is not None or k in old}


def admin_token(kube, ns: str, name: str) -> str | None:
    secret = kube.get("Secret", ns, render.admin_secret_name(name))
    if secret is None:
        return None
    if (secret.get("data") or {}).get("token"):
        return base64.b64decode(secret["data"]["token"]).decode()
    return (secret.get("stringData") or {}).get("token")


def _generation(body: dict) -> int:
    return body["metadata"].get("generation", 1)


def replicas_of(deployment: dict) -> Replicas:
    """(spec.replicas, status.readyReplicas) of a Deployment."""
    return (deployment.get("spec") or {}).get("replicas", 0), ((deployment.get("status") or {}).get("readyReplicas")
                                                               or 0)


def _disagrees(scrape: Scrape, state: speculation.SpeculationState) -> bool:
    on = scrape.gauges.get("specfleet:speculation_enabled")
    k = scrape.gauges.get("specfleet:num_speculative_tokens")
    if on is None:
        return False
    return bool(on) != state.enabled or (state.enabled and k is not None and int(k) != state.k)


def _record_metrics(m: telemetry.ServiceMetrics, spec, plan, step: loop.Step, ready: int, window: Window | None,
                    st: loop.ServiceLoop) -> None:
    t = telemetry
    if step.scale is not None:
        m.set(t.DESIRED, step.scale.desired)
        m(t.DECISIONS, "scale", step.scale.reason).inc()
    if step.spec is not None:
        m(t.DECISIONS, "speculation", step.spec.reason).inc()
    if step.budget is not None:
        for span, value in step.budget.attainment.items():
            m.set(t.BUDGET_ATTAINMENT, value, span)
        for span, value in step.budget.burn_rate.items():
            m.set(t.BURN_RATE, value, span)
    m.set(t.ACTUAL, ready)
    m.set(t.PREDICTED, plan.predicted.ttft_p99_ms / 1000, "ttft")
    m.set(t.PREDICTED, plan.predicted.itl_p99_ms / 1000, "itl")
    m.set(t.TARGET, spec.slo.ttft_p99_ms / 1000, "ttft")
    m.set(t.TARGET, spec.slo.itl_p99_ms / 1000, "itl")
    m.set(t.OBJECTIVE, spec.slo.objective)
    if st.speculation is not None:
        m.set(t.SPECULATION, float(st.speculation.enabled))
        m.set(t.SPEC_K, st.speculation.k)
    if window is None:
        return
    for metric, value in (("ttft", window.ttft_p99), ("itl", window.itl_p99)):
        if value is not None:
            m.set(t.OBSERVED, value, metric)
    attainment = window.slo_attainment(st.model.ttft_s, st.model.itl_s)
    if attainment is not None:
        m.set(t.ATTAINMENT, attainment)
    acceptance = window.acceptance_rate if window.acceptance_rate is not None else window.counterfactual_acceptance_rate
    if acceptance is not None:
        m.set(t.ACCEPTANCE, acceptance)
