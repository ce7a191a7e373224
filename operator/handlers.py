"""kopf handlers: thin glue from InferenceService events to the pure planner/renderer/status.

`reconcile(body, kube, now)` does one reconciliation and returns the status patch and the Events to
post; the kopf handlers below only call it. Create, spec update and resume (operator restart) all
reconcile; so does any change to or deletion of an owned Deployment/Service/PDB, which is how drift
is corrected. Owned objects carry an owner reference, so deleting the InferenceService lets the
garbage collector remove them; the operator needs no finalizer. The CR's spec is never written.
"""
from __future__ import annotations

import datetime as dt
import logging
import secrets
from dataclasses import dataclass, field

import kopf

from specfleet.operator import api, catalogs, planner, render, status
from specfleet.operator.control import loop as control
from specfleet.operator.kube import Kube

MANAGED = {"app.kubernetes.io/managed-by": render.MANAGED_BY}
_kube: Kube | None = None


@dataclass
class Outcome:
    """What one reconciliation decided: the status patch and (type, reason, message) Events."""

    status: dict
    events: list[tuple[str, str, str]] = field(default_factory=list)


def kube() -> Kube:
    global _kube
    if _kube is None:
        _kube = Kube.from_environment()
    return _kube


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def retry_backoff(retry: int) -> float:
    """Seconds before retry number `retry + 1` of a reconcile that hit API trouble: 1, 2, 4, ... 60."""
    return float(min(2 ** retry, 60))


def reconcile(body: dict, k: Kube, now: str) -> Outcome:
    """Plan, render and apply one InferenceService; never raises for a bad spec."""
    meta, old = body["metadata"], body.get("status") or {}
    name, namespace, generation = meta["name"], meta["namespace"], meta.get("generation", 1)
    previous = old.get("conditions") or []
    try:
        spec = api.parse_spec(body.get("spec") or {})
    except api.SpecError as exc:
        return Outcome(status.invalid(exc.errors, generation, previous, now),
                       [("Warning", "InvalidSpec", str(exc))])
    result = planner.plan(spec, catalogs.gpus(), catalogs.models())
    selector = render.selector_string(name)
    if isinstance(result, planner.Infeasible):
        patch = status.planned(result, generation, selector, previous, now)
        return Outcome(patch, [("Warning", result.reason, _message(patch, "Degraded"))])
    live = k.get("Deployment", namespace, name)
    replicas = _replicas(spec, result, live)
    applied = _apply(k, body, spec, result, replicas)
    patch = status.planned(result, generation, selector, previous, now)
    patch["desiredReplicas"] = replicas
    deployment = k.get("Deployment", namespace, name) if applied["Deployment"] != "unchanged" else live
    patch.update(_rollout(deployment, replicas, patch["conditions"], now, generation))
    return Outcome(patch, _events(old, patch, result, applied))


def _message(patch: dict, kind: str) -> str:
    return next(c["message"] for c in patch["conditions"] if c["type"] == kind)


def _replicas(spec: api.InferenceServiceSpec, plan: planner.Plan, live: dict | None) -> int:
    """Fixed spec.replicas wins; otherwise keep the autoscaler's current count within min/max."""
    if spec.replicas is not None or live is None:
        return plan.replicas
    current = (live.get("spec") or {}).get("replicas", plan.replicas)
    auto = spec.autoscaling
    return min(max(current, auto.min_replicas), auto.max_replicas)


def _apply(k: Kube, body: dict, spec: api.InferenceServiceSpec, plan: planner.Plan, replicas: int) -> dict:
    meta = body["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta.get("uid", "")
    if spec.runtime.engine == "specfleet":
        token = secrets.token_urlsafe(32)
        k.create_if_missing(render.with_owner(render.admin_secret(name, namespace, token), name, uid))
        k.apply(render.with_owner(render.network_policy(name, namespace), name, uid))
    override = _speculation_override(spec, plan, k.get("Deployment", namespace, name))
    return {m["kind"]: k.apply(render.with_owner(m, name, uid))
            for m in render.render(name, namespace, spec, plan, replicas, speculation=override)}


def _speculation_override(spec: api.InferenceServiceSpec, plan: planner.Plan, live: dict | None):
    """The control loop's speculation choice for the vllm runtime (kept on the Deployment), if any."""
    value = ((live or {}).get("metadata", {}).get("annotations") or {}).get(control.SPECULATION_ANNOTATION)
    if spec.runtime.engine != "vllm" or not value or plan.speculation.method is None:
        return None
    fields = dict(part.split("=", 1) for part in value.split(",") if "=" in part)
    try:
        return planner.SpeculationPlan(fields.get("enabled") == "true", plan.speculation.method, int(fields["k"]))
    except (KeyError, ValueError):
        return None


def _rollout(deployment: dict | None, desired: int, conditions: list, now: str, generation: int) -> dict:
    st = (deployment or {}).get("status") or {}
    return status.rollout(desired, st.get("replicas", 0), st.get("readyReplicas", 0), conditions, now, generation)


def _events(old: dict, patch: dict, plan: planner.Plan, applied: dict) -> list[tuple[str, str, str]]:
    events = []
    if old.get("plan") != patch["plan"] or old.get("desiredReplicas") != patch["desiredReplicas"]:
        p = patch["plan"]
        events.append(("Normal", "Planned",
                       f"{p['gpusPerReplica']}x {plan.accelerator}, {p['kvCacheBlocks']} KV blocks, "
                       f"maxNumSeqs {p['maxNumSeqs']}, token budget {p['maxNumBatchedTokens']}, "
                       f"speculation {'on' if p['speculation']['enabled'] else 'off'} k={p['speculation']['k']}, "
                       f"{patch['desiredReplicas']} replicas; predicted TTFT p99 {p['predicted']['ttftP99Ms']} ms, "
                       f"ITL p99 {p['predicted']['itlP99Ms']} ms"))
    for warning in plan.warnings:
        events.append(("Warning", "CapacityLimited", warning))
    changed = [f"{verb} {kind}" for kind, verb in applied.items() if verb != "unchanged"]
    if changed:
        events.append(("Normal", "Applied", ", ".join(changed)))
    return events


def _post(body: dict, events: list[tuple[str, str, str]]) -> None:
    for kind, reason, message in events:
        kopf.event(body, type=kind, reason=reason, message=message[:1000])


# -- kopf wiring ------------------------------------------------------------------------------------
@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="specfleet.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="specfleet.io", key="last-handled-configuration")
    settings.persistence.finalizer = "specfleet.io/operator"
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = 16
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60


@kopf.on.resume(api.GROUP, api.VERSION, api.PLURAL)
@kopf.on.create(api.GROUP, api.VERSION, api.PLURAL)
@kopf.on.update(api.GROUP, api.VERSION, api.PLURAL, field="spec")
def reconcile_service(body: kopf.Body, patch: kopf.Patch, retry: int = 0, **_) -> None:
    k = kube()
    try:
        outcome = reconcile(_plain(body), k, now_iso())
    except Exception as exc:
        if not k.transient(exc):
            raise
        # kopf's default for an arbitrary error is a flat 60 s; API trouble is retried sooner, doubling.
        raise kopf.TemporaryError(f"API server: {type(exc).__name__}: {str(exc)[:200]}",
                                  delay=retry_backoff(retry)) from exc
    patch.status.update(outcome.status)
    _post(body, outcome.events)


@kopf.timer(api.GROUP, api.VERSION, api.PLURAL, interval=control.interval_s(),
            initial_delay=control.interval_s())
async def control_service(body: kopf.Body, patch: kopf.Patch, **_) -> None:
    """The control loop (control/loop.py): scale the Deployment, switch speculation, report why."""
    await _control(body, patch, control.run_once, forget=True)


async def detect_surge(body: kopf.Body, patch: kopf.Patch, **_) -> None:
    """Surge detection between control intervals (control/loop.py:run_detect): scale-ups only."""
    await _control(body, patch, control.run_detect, forget=False)


async def _control(body: kopf.Body, patch: kopf.Patch, run, forget: bool) -> None:
    plain = _plain(body)
    if plain["metadata"].get("deletionTimestamp"):
        if forget:
            control.forget(plain["metadata"]["namespace"], plain["metadata"]["name"])
        return
    k = kube()
    try:
        outcome = await run(plain, k, now_iso())
    except Exception as exc:
        if not k.transient(exc):
            raise
        # The next interval re-reads everything; kopf's 60 s timer backoff would stall the loop instead.
        logging.getLogger(__name__).warning("control of %s/%s skipped: API server: %s",
                                            plain["metadata"]["namespace"], plain["metadata"]["name"], exc)
        return
    if outcome is None:
        return
    patch.status.update(outcome.status)
    _post(body, outcome.events)


if control.detect_interval_s() > 0:
    kopf.timer(api.GROUP, api.VERSION, api.PLURAL, interval=control.detect_interval_s(),
               initial_delay=control.interval_s())(detect_surge)


@kopf.on.delete(api.GROUP, api.VERSION, api.PLURAL, optional=True)
def deleted(body: kopf.Body, **_) -> None:
    control.forget(body["metadata"]["namespace"], body["metadata"]["name"])


@kopf.on.event("apps", "v1", "deployments", labels=MANAGED)
@kopf.on.event("", "v1", "services", labels=MANAGED)
@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels=MANAGED)
def owned_changed(event: dict, body: kopf.Body, logger: logging.Logger, **_) -> None:
    """An owned object changed or vanished: reconcile its InferenceService (restores drift, updates status)."""
    if event.get("type") not in ("MODIFIED", "DELETED"):
        return
    owner = _owner(body)
    if owner is None:
        return
    k = kube()
    service = k.get_service(body["metadata"]["namespace"], owner)
    if service is None or service["metadata"].get("deletionTimestamp"):
        return
    outcome = reconcile(service, k, now_iso())
    if _changed(service.get("status") or {}, outcome.status):
        k.patch_service_status(service["metadata"]["namespace"], owner, outcome.status)
    _post(service, outcome.events)
    logger.debug("reconciled %s after %s %s", owner, event.get("type"), body.get("kind"))


def _owner(body) -> str | None:
    for ref in body.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("kind") == api.KIND and ref.get("apiVersion", "").startswith(api.GROUP + "/"):
            return ref.get("name")
    return None


def _changed(old: dict, new: dict) -> bool:
    """Whether a status patch changes anything but condition timestamps."""
    def strip(s: dict) -> dict:
        conds = [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in s.get("conditions") or []]
        return {**{k: v for k, v in s.items() if k in new}, "conditions": conds}
    return strip(old) != strip(new)


def _plain(body) -> dict:
    """A kopf Body as plain nested dicts (kopf's views are read-only mappings)."""
    return {"metadata": _dict(body.get("metadata", {})), "spec": _dict(body.get("spec", {})),
            "status": _dict(body.get("status", {}))}


def _dict(value):
    if hasattr(value, "items"):
        return {k: _dict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_dict(v) for v in value]
    return value
