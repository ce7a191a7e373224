"""A running service keeps the sizes it was rendered with until its spec changes.

An operator release that prices steps differently (a new cost model, GPU catalog or profile) would
otherwise re-size every running service when it starts, and roll every engine pod of the fleet at once.
While `status.observedGeneration` is the spec's generation, the plan's sizes, speculation and
predictions are those `status.plan` holds, and its warnings those of the `CapacityLimited` condition;
a spec edit (a new generation) plans afresh. The reconcile and the control loop both plan through
`kept_plan`.

To take a new release's pricing without a spec edit, a user annotates the service:
`kubectl annotate inferenceservice NAME specfleet.io/replan="$(date +%s)" --overwrite`. A value the status
has not yet recorded (`status.replanned`) plans afresh once (`replan_asked`); the reconcile records it.
"""
from __future__ import annotations

from dataclasses import replace

from specfleet.operator import catalogs, planner
from specfleet.operator.api import InferenceServiceSpec
from specfleet.operator.planner import Infeasible, Plan
from specfleet.operator.status import plan_fields, plan_warnings


REPLAN = "specfleet.io/replan"


def replan_asked(metadata: dict, status: dict) -> str:
    """The `specfleet.io/replan` annotation's value while the status has not recorded it ("": none asked)."""
    asked = str((metadata.get("annotations") or {}).get(REPLAN) or "")
    return asked if asked != str(status.get("replanned") or "") else ""


def kept_plan(spec: InferenceServiceSpec, status: dict, generation: int, fresh: bool = False) -> Plan | Infeasible:
    """The shipped catalogs' plan of `spec`, pinned to the running sizes (`pinned`) unless `fresh`."""
    plan = planner.plan(spec, catalogs.gpus(), catalogs.models(), catalogs.profiles())
    return plan if fresh else pinned(plan, status, generation)


def pinned(plan: Plan | Infeasible, status: dict, generation: int) -> Plan | Infeasible:
    """`plan` with the sizes of `status.plan` when the status observed this generation; else `plan`."""
    stored = status.get("plan")
    if not isinstance(plan, Plan) or not isinstance(stored, dict) or status.get("observedGeneration") != generation:
        return plan
    try:
        return replace(plan, **plan_fields(stored), warnings=plan_warnings(status.get("conditions") or []))
    except (KeyError, TypeError, ValueError):
        return plan


def replanned_message(asked: str, before: dict | None, after: dict | None) -> str:
    """The `Replanned` Event: what the fresh plan changed in `status.plan`, key by key."""
    if after is None or not before:
        return f"planned afresh ({REPLAN}={asked}): " + ("no earlier plan" if after else
                                                          "no plan (the Degraded condition says why)")
    old, new = _flat(before), _flat(after)
    changed = [f"{key} {old.get(key, '-')} -> {new.get(key, '-')}" for key in sorted(set(old) | set(new))
               if old.get(key) != new.get(key)]
    return f"planned afresh ({REPLAN}={asked}): " + ("; ".join(changed) if changed else "the plan is unchanged")


def _flat(plan: dict, prefix: str = "") -> dict:
    out: dict = {}
    for key, value in plan.items():
        out.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out
