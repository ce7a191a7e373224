"""One reconciliation of an InferenceService (pure apart from the `Kube` verbs it is handed): parse the spec,
plan, render, apply the owned objects and return the status patch and Events (`reconcile`).

`reconcile(body, kube, now)` never raises for a bad spec: an invalid spec or an infeasible plan becomes a
Degraded status and a Warning Event, and nothing is applied. PlanOnly reports what Serving would do and
writes no object. The replica count is `spec.replicas` when set, otherwise the Deployment's (the
autoscaler owns it); the vllm runtime's speculation choice is read back from the Deployment's annotation.
The kopf handlers (`handlers.py`) call it and write its outcome; `retry_backoff` spaces their retries.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from specfleet.operator import adapters, api, catalogs, model_folder, plan_only, plan_pinning, planner, render, status
from specfleet.operator.control import loop
from specfleet.operator.kube import UNREAD, Kube


@dataclass
class ReconcileOutcome:
    """What one reconciliation decided: the status patch and (type, reason, message) Events."""

    status: dict
    events: list[tuple[str, str, str]] = field(default_factory=list)


def retry_backoff(retry: int) -> float:
    """Seconds before retry number `retry + 1` of a reconcile that hit API trouble: 1, 2, 4, ... 60."""
    return float(min(2 ** retry, 60))


def reconcile(body: dict, k: Kube, now: str) -> ReconcileOutcome:
    """Plan, render and apply one InferenceService; never raises for a bad spec. A `specfleet.io/replan`
    the status has not recorded plans afresh (`plan_pinning`) and is recorded, with a `Replanned` Event."""
    old = body.get("status") or {}
    asked = plan_pinning.replan_asked(body["metadata"], old)
    outcome = _reconcile(body, k, now, fresh=bool(asked))
    if asked:
        outcome.status["replanned"] = asked
        outcome.events.append(("Normal", "Replanned",
                               plan_pinning.replanned_message(asked, old.get("plan"), outcome.status.get("plan"))))
    return outcome


def _reconcile(body: dict, k: Kube, now: str, fresh: bool) -> ReconcileOutcome:
    meta, old = body["metadata"], body.get("status") or {}
    name, namespace, generation = meta["name"], meta["namespace"], meta.get("generation", 1)
    previous = old.get("conditions") or []
    try:
        spec = api.parse_spec(body.get("spec") or {})
    except api.SpecError as exc:
        return ReconcileOutcome(status.invalid(exc.errors, generation, previous, now),
                       [("Warning", "InvalidSpec", str(exc))])
    spec = model_folder.with_folder_architecture(spec, catalogs.models())
    result = plan_pinning.kept_plan(spec, old, generation, fresh)
    selector = render.selector_string(name)
    if isinstance(result, planner.Infeasible):
        patch = status.planned(result, generation, selector, previous, now)
        return ReconcileOutcome(patch, [("Warning", result.reason, _message(patch, "Degraded"))])
    live = k.get("Deployment", namespace, name)
    replicas = _replicas(spec, result, live)
    if spec.plan_only:
        return _plan_only(body, k, spec, result, replicas, live, now)
    applied = _apply(k, body, spec, result, replicas, live)
    problems = adapters.problems(adapters.desired(spec), old.get("adapters") or [])
    patch = status.planned(result, generation, selector, previous, now, problems)
    patch["desiredReplicas"] = replicas
    if old.get("plannedActions") is not None:
        patch["plannedActions"] = None          # merge patch: Serving does what it planned; drop the list
    verb = applied["Deployment"]            # a Deployment just created has no status yet: no need to read it
    deployment = live if verb == "unchanged" else None if verb == "created" else k.get("Deployment", namespace, name)
    patch.update(_rollout(deployment, replicas, patch["conditions"], now, generation))
    return ReconcileOutcome(patch, _events(old, patch, result, applied))


def _plan_only(body: dict, k: Kube, spec: api.InferenceServiceSpec, plan: planner.Plan, replicas: int,
               live: dict | None, now: str) -> ReconcileOutcome:
    """PlanOnly: the plan and what Serving mode would do, in status and Events; no object is written."""
    meta, old = body["metadata"], body.get("status") or {}
    name, namespace, generation = meta["name"], meta["namespace"], meta.get("generation", 1)
    desired = _desired(body, spec, plan, replicas, live, token="")
    actions = plan_only.planned_actions(desired, lambda kind, n: k.get(kind, namespace, n), replicas)
    patch = status.planned(plan, generation, render.selector_string(name), old.get("conditions") or [], now)
    patch["desiredReplicas"] = replicas
    patch = plan_only.plan_only_status(patch, actions, generation, now)
    events = _events(old, patch, plan, {})
    if old.get("plannedActions") != actions:
        events.append(("Normal", "PlanOnly", "would " + ("; ".join(actions) if actions else "do nothing")))
    return ReconcileOutcome(patch, events)


def _message(patch: dict, kind: str) -> str:
    return next(c["message"] for c in patch["conditions"] if c["type"] == kind)


def _replicas(spec: api.InferenceServiceSpec, plan: planner.Plan, live: dict | None) -> int:
    """Fixed spec.replicas wins; otherwise keep the autoscaler's current count within min/max."""
    if spec.replicas is not None or live is None:
        return plan.replicas
    current = (live.get("spec") or {}).get("replicas", plan.replicas)
    auto = spec.autoscaling
    return min(max(current, auto.min_replicas), auto.max_replicas)


def _apply(k: Kube, body: dict, spec: api.InferenceServiceSpec, plan: planner.Plan, replicas: int,
           live: dict | None) -> dict:
    """Create or correct every owned object; returns each kind's verb. `live` is the Deployment as read:
    without one the service is new, so each object is created at once rather than read first (a 409 still
    reads and compares), which halves a new service's round trips."""
    applied = {}
    for manifest in _desired(body, spec, plan, replicas, live, token=secrets.token_urlsafe(32)):
        kind = manifest["kind"]
        known = live if kind == "Deployment" or live is None else UNREAD
        if kind == "Secret":
            k.create_if_missing(manifest, known)            # the token is made once, never rewritten
        elif kind == "NetworkPolicy":
            k.apply(manifest, known)
        else:
            applied[kind] = k.apply(manifest, known)
    return applied


def _desired(body: dict, spec: api.InferenceServiceSpec, plan: planner.Plan, replicas: int, live: dict | None,
             token: str) -> list[dict]:
    """Every object a Serving reconcile applies, owner references set (the admin Secret with `token`)."""
    meta = body["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta.get("uid", "")
    out = []
    if spec.runtime.engine == "specfleet":
        out += [render.admin_secret(name, namespace, token), render.network_policy(name, namespace)]
    override = _speculation_override(spec, plan, live)
    out += render.render(name, namespace, spec, plan, replicas, speculation=override)
    return [render.with_owner(m, name, uid) for m in out]


def _speculation_override(spec: api.InferenceServiceSpec, plan: planner.Plan, live: dict | None):
    """The control loop's speculation choice for the vllm runtime (kept on the Deployment), if any."""
    value = ((live or {}).get("metadata", {}).get("annotations") or {}).get(loop.SPECULATION_ANNOTATION)
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
    if plan.calibration.refused and old.get("observedGeneration") != patch.get("observedGeneration"):
        events.append(("Warning", status.PROFILE_REFUSED, status.profile_refused(plan)))    # once a generation
    changed = [f"{verb} {kind}" for kind, verb in applied.items() if verb != "unchanged"]
    if changed:
        events.append(("Normal", "Applied", ", ".join(changed)))
    return events
