"""kopf handlers, and only them: thin glue from InferenceService, Pod and Deployment events to the
reconciler (`reconcile.py`) and the control loop.

`reconcile.reconcile(body, kube, now)` does one reconciliation and returns the status patch and the
Events to post; the handlers here only call it and `publish` the outcome. Create, spec update and resume
(operator restart) all reconcile; so does any change to or deletion of an owned Deployment/Service/PDB,
which is how drift is corrected, and a `specfleet.io/replan` annotation the status has not recorded
(`plan_pinning`). Owned objects carry an owner reference, so deleting the InferenceService lets the
garbage collector remove them. The CR's spec is never written.

One scheduler (`control/scheduler.py`, started at startup) runs the control loops of all
InferenceServices (`control/runner.py`); engine pods and replica counts reach it through the Pod and
Deployment watches (`discovery.EngineView`), so a step reads nothing from the API and an idle service
costs a heap push an interval. `publish` is the one writer of status, for reconciles and control steps
alike. What is shared (the `Kube` client, the loop's intervals) is set up once at startup in kopf's
`memo`; nothing is read from the environment at import time.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time

import httpx
import kopf

from specfleet.operator import api, plan_pinning, render, status
from specfleet.operator.threads import in_control_thread
from specfleet.operator.control import adapter_sync, discovery, loop, runner, scale_from_zero, scheduler, sources
from specfleet.operator.control.runner import now_iso
from specfleet.operator.control.scrape import SCRAPE_TIMEOUT_S
from specfleet.operator.kube import FORBIDDEN_RETRY_S, Kube
from specfleet.operator.reconcile import ReconcileOutcome, reconcile, retry_backoff

MANAGED = {"app.kubernetes.io/managed-by": render.MANAGED_BY}
# kopf starts one worker per object with an event, all at once: a burst of 5,000 creates held ~5,000 handlers
# (bodies, kopf's per-event state, our copies; some 45 KiB each) in memory while six threads reconciled them,
# and CPython keeps that peak in its arenas for good (docs/operator.md, "Memory and idle cost"). Beyond the
# limit an object waits as its raw event alone. A worker keeps its slot until its object is quiet for
# `WORKER_IDLE_S` (with kopf's default 5 s, parked slots rather than the reconciles would pace a burst).
DEFAULT_WORKER_LIMIT = 512
WORKER_IDLE_S = 1.0
# After its own patch of an object (the diff-base annotation that marks a creation handled), kopf waits
# this long for the watch to deliver that version before it acts on an older event of the object, such
# as the one of the status this operator wrote a moment before; past it, it takes the older body as
# current, finds no diff base, and handles the creation again. kopf's 5 s was shorter than the watch's lag
# in a burst of 5,000 creates on one core: every service was reconciled twice, and the repeats held SLO
# edits back for tens of seconds. A newer event of the object ends the wait at once.
CONSISTENCY_TIMEOUT_S = 60.0
STATUS_WRITE_TRIES = 3
log = logging.getLogger("specfleet.operator")


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="specfleet.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="specfleet.io", key="last-handled-configuration")
    settings.persistence.finalizer = "specfleet.io/operator"
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = 16
    settings.queueing.worker_limit = worker_limit()
    settings.queueing.idle_timeout = WORKER_IDLE_S
    settings.persistence.consistency_timeout = CONSISTENCY_TIMEOUT_S
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    if getattr(memo, "kube", None) is None:
        memo.kube = Kube.from_environment()
    if getattr(memo, "loop_config", None) is None:
        memo.loop_config = loop.LoopConfig.from_environment()
    memo.http = httpx.AsyncClient(timeout=SCRAPE_TIMEOUT_S)
    memo.source = sources.source_for(memo.loop_config.prometheus_url, memo.http)
    memo.engines = discovery.EngineView()
    memo.cold_starts = {}           # (namespace, name) -> (monotonic wake-up, held requests), shared by all

    async def publish_step(body: dict, outcome: runner.ControlOutcome) -> None:
        await in_control_thread(publish, memo.kube, body, outcome)

    memo.adapters = adapter_sync.AdapterSync(memo.kube, memo.http)
    memo.scheduler = scheduler.ControlScheduler(memo.engines, publish_step, after_interval=memo.adapters.run)
    memo.scheduler_task = asyncio.create_task(memo.scheduler.run())


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_) -> None:
    memo.scheduler_task.cancel()
    await memo.http.aclose()


def worker_limit(env=os.environ) -> int:
    """Objects of one kind handled at once (`SPECFLEET_WORKER_LIMIT`, default `DEFAULT_WORKER_LIMIT`)."""
    value = int(env.get("SPECFLEET_WORKER_LIMIT") or DEFAULT_WORKER_LIMIT)
    if value < 1:
        raise ValueError(f"SPECFLEET_WORKER_LIMIT must be at least 1, got {value}")
    return value


def publish(k: Kube, body, outcome: ReconcileOutcome | runner.ControlOutcome) -> None:
    """The one writer of an InferenceService's status (only when something but timestamps changed), and
    the poster of its Events, both through `Kube`."""
    meta = body["metadata"]
    if outcome.status:
        write_status(k, meta["namespace"], meta["name"], dict(body.get("status") or {}), outcome.status,
                     meta.get("resourceVersion"))
    regarding = {"apiVersion": body.get("apiVersion", api.API_VERSION), "kind": body.get("kind", api.KIND),
                 "metadata": meta}
    for kind, reason, message in outcome.events:
        k.post_event(regarding, kind, reason, message[:1000], now_iso())


def write_status(k: Kube, namespace: str, name: str, read: dict, patch: dict, version: str | None) -> None:
    """Write `patch`, made from the status `read` at `version`, if it changes anything. Reconciles and control
    steps write conditions and decisions as whole lists, each from the body it last saw: onto a newer
    version (a 409) the patch is made again on the current status (`status.rebase`), so neither undoes
    the other's entries. Gives up, raising the 409, after `STATUS_WRITE_TRIES`."""
    for tries in range(1, STATUS_WRITE_TRIES + 1):
        if not status.changes(read, patch):
            return
        try:
            k.patch_service_status(namespace, name, patch, version)
            return
        except Exception as exc:
            if not k.conflict(exc) or tries == STATUS_WRITE_TRIES:
                raise
        current = k.get_service(namespace, name)
        if current is None:
            return
        fresh = current.get("status") or {}
        patch, read = status.rebase(patch, _dict(read), fresh), fresh   # `read` may be kopf's read-only view
        version = current["metadata"].get("resourceVersion")


@kopf.on.resume(api.GROUP, api.VERSION, api.PLURAL)
@kopf.on.create(api.GROUP, api.VERSION, api.PLURAL)
@kopf.on.update(api.GROUP, api.VERSION, api.PLURAL, field="spec")
async def reconcile_service(body: kopf.Body, memo: kopf.Memo, retry: int = 0, **_) -> None:
    k = memo.kube
    try:
        chosen = await _choose_pods_for_spec_scale_down(memo, _plain(body))
        plain = _plain(body)
        synced = await _sync_adapters(memo, plain)
        outcome = await asyncio.to_thread(reconcile, plain, k, now_iso())
        outcome.events[:0] = chosen
        if synced is not None:
            outcome.status.update({key: v for key, v in synced.status.items() if key != "conditions"})
            outcome.events += synced.events
        await asyncio.to_thread(publish, k, body, outcome)
    except Exception as exc:
        denied = k.forbidden(exc)
        if denied is not None:
            await asyncio.to_thread(report_forbidden, k, _plain(body), denied)
            raise kopf.TemporaryError(f"missing RBAC permission: {denied}", delay=FORBIDDEN_RETRY_S) from exc
        if not k.transient(exc):
            raise
        # kopf's default for an arbitrary error is a flat 60 s; API trouble is retried sooner, doubling.
        raise kopf.TemporaryError(f"API server: {type(exc).__name__}: {str(exc)[:200]}",
                                  delay=retry_backoff(retry)) from exc


async def _sync_adapters(memo: kopf.Memo, body: dict) -> runner.ControlOutcome | None:
    """A spec change reaches the pods' adapters now, not at the next interval; the reconcile that follows
    judges Degraded from the adapter status this run found (put into `body`)."""
    meta = body["metadata"]
    synced = await memo.adapters.run(body, memo.engines.pods(meta["namespace"], meta["name"]))
    if synced is not None:
        body["status"] = {**body["status"], **{key: v for key, v in synced.status.items() if key != "conditions"}}
    return synced


def report_forbidden(k: Kube, body: dict, message: str) -> None:
    """A 403: say which permission is missing (the server's message names user, verb, resource and namespace),
    then, as far as RBAC still allows, set Degraded=True/Forbidden in status and post a Warning Event."""
    meta = body["metadata"]
    log.error("missing RBAC permission for %s/%s: %s", meta["namespace"], meta["name"], message)
    previous = (body.get("status") or {}).get("conditions") or []
    outcome = ReconcileOutcome(status.forbidden(message, meta.get("generation", 1), previous, now_iso()),
                               [("Warning", "Forbidden", f"missing RBAC permission: {message}")])
    try:
        publish(k, body, outcome)
    except Exception as exc:  # noqa: BLE001  (status or events may be forbidden too: the log line stays)
        log.error("could not report the missing permission on %s/%s: %s", meta["namespace"], meta["name"],
                  k.forbidden(exc) or exc)


async def _choose_pods_for_spec_scale_down(memo: kopf.Memo, body: dict) -> list[tuple[str, str, str]]:
    """A fixed `spec.replicas` below the Deployment's: mark the least loaded pods to go before the
    reconcile lowers it (the autoscaler's scale-downs mark theirs in the control step)."""
    control, meta = getattr(memo, "control", None), body["metadata"]
    current = memo.engines.replicas(meta["namespace"], meta["name"])
    try:
        spec = api.parse_spec(body.get("spec") or {})
    except api.SpecError:
        return []
    if control is None or current is None or spec.plan_only or spec.replicas is None or spec.replicas >= current[0]:
        return []
    return await control.before_spec_scale_down(memo.engines.pods(meta["namespace"], meta["name"]), spec.replicas)


@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL)
async def track_service(event: dict, body: kopf.Body, memo: kopf.Memo, **_) -> None:
    """Every InferenceService is under the control scheduler from the first time it is seen until it goes;
    its loop's state (`ServiceControl`) lives in the service's kopf memo."""
    meta = body["metadata"]
    key = (meta["namespace"], meta["name"])
    if event.get("type") == "DELETED" or meta.get("deletionTimestamp"):
        memo.scheduler.forget(key)
        memo.adapters.forget(key)
        return
    if getattr(memo, "control", None) is None:
        memo.control = runner.ServiceControl(*key, memo.kube, memo.loop_config, memo.http, source=memo.source)
    memo.scheduler.track(key, memo.control, scheduler.StoredBody.of(_plain(body)))
    # A re-plan rides the watch event, not an on.update(field=...) handler: kopf's diff base leaves out the
    # annotations under its own storage prefix (specfleet.io/), so it would never see this one change.
    if plan_pinning.replan_asked(meta, body.get("status") or {}):
        await asyncio.to_thread(reconcile_now, memo.kube, _plain(body))
    held = scale_from_zero.held_requests(meta.get("annotations"))
    if held:
        await _wake(memo, key, _plain(body), held)


async def _wake(memo: kopf.Memo, key: tuple[str, str], body: dict, held: int) -> None:
    """A service at 0 replicas whose requests the gateway holds: scale it to 1 now (scale_from_zero)."""
    try:
        spec = api.parse_spec(body.get("spec") or {})
    except api.SpecError:
        return
    pending = memo.cold_starts.get(key)
    # A wake-up whose scale the Deployment watch has not reported yet is in flight; an older one that never
    # got a ready replica (the service went back to 0) is replaced.
    in_flight = pending is not None and time.monotonic() - pending[0] < scale_from_zero.WAKE_IN_FLIGHT_S
    if in_flight or not scale_from_zero.should_wake(spec, held, memo.engines.replicas(*key)):
        return
    memo.cold_starts[key] = (time.monotonic(), held)
    try:
        await asyncio.to_thread(memo.kube.scale, "Deployment", *key, 1)
    except Exception:
        memo.cold_starts.pop(key, None)         # the next annotation change tries again
        raise
    when = now_iso()
    decision = {"time": when, "kind": "scale", "from": "0", "to": "1", "reason": "HeldRequests"}
    decisions = ((body.get("status") or {}).get("lastDecisions") or []) + [decision]
    outcome = runner.ControlOutcome({"desiredReplicas": 1, "lastDecisions": decisions[-loop.MAX_DECISIONS:]}, [
        ("Normal", "ScaleFromZero", f"0 -> 1 replicas: the gateway holds {held} request(s)")])
    await asyncio.to_thread(publish, memo.kube, body, outcome)


@kopf.on.event("", "v1", "pods", labels=MANAGED)
async def engine_pod_changed(event: dict, body: kopf.Body, memo: kopf.Memo, **_) -> None:
    """Engine pods as the control loop sees them (labels, Ready, podIP, container port, Unschedulable)."""
    memo.engines.pod_changed(_dict(body), gone=event.get("type") == "DELETED")


@kopf.on.event("apps", "v1", "deployments", labels=MANAGED)
async def engine_replicas_changed(event: dict, body: kopf.Body, memo: kopf.Memo, **_) -> None:
    meta = body["metadata"]
    gone = event.get("type") == "DELETED"
    replicas = None if gone else runner.replicas_of(_dict(body))
    memo.engines.replicas_changed(meta["namespace"], meta["name"], replicas)
    key = (meta["namespace"], meta["name"])
    if key in memo.cold_starts and replicas is not None and replicas[1] >= 1:
        started, held = memo.cold_starts.pop(key)
        seconds = time.monotonic() - started
        service = await asyncio.to_thread(memo.kube.get_service, *key)
        if service is not None:
            outcome = runner.ControlOutcome(scale_from_zero.cold_start_status(seconds, held, now_iso()), [
                ("Normal", "ColdStart", f"first replica ready {seconds:.1f} s after {held} held request(s) woke it")])
            await asyncio.to_thread(publish, memo.kube, service, outcome)


@kopf.on.event("apps", "v1", "deployments", labels=MANAGED)
@kopf.on.event("", "v1", "services", labels=MANAGED)
@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels=MANAGED)
def owned_changed(event: dict, body: kopf.Body, memo: kopf.Memo, logger: logging.Logger, **_) -> None:
    """An owned object changed or vanished: reconcile its InferenceService (restores drift, updates status)."""
    if event.get("type") not in ("MODIFIED", "DELETED"):
        return
    owner = _owner(body)
    if owner is None:
        return
    service = memo.kube.get_service(body["metadata"]["namespace"], owner)
    if service is None or service["metadata"].get("deletionTimestamp"):
        return
    reconcile_now(memo.kube, service)
    logger.debug("reconciled %s after %s %s", owner, event.get("type"), body.get("kind"))


def reconcile_now(k: Kube, service: dict) -> None:
    """Reconcile `service` outside kopf's spec handlers (an owned object changed, a re-plan was asked);
    a missing permission is reported, and the resume/retry of reconcile_service tries again."""
    try:
        publish(k, service, reconcile(service, k, now_iso()))
    except Exception as exc:
        denied = k.forbidden(exc)
        if denied is None:
            raise
        report_forbidden(k, service, denied)


def _owner(body) -> str | None:
    for ref in body.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("kind") == api.KIND and ref.get("apiVersion", "").startswith(api.GROUP + "/"):
            return ref.get("name")
    return None


def _plain(body) -> dict:
    """A kopf Body as plain nested dicts (kopf's views are read-only mappings)."""
    return {"apiVersion": body.get("apiVersion", api.API_VERSION), "kind": body.get("kind", api.KIND),
            "metadata": _dict(body.get("metadata", {})), "spec": _dict(body.get("spec", {})),
            "status": _dict(body.get("status", {}))}


def _dict(value):
    if hasattr(value, "items"):
        return {k: _dict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_dict(v) for v in value]
    return value
