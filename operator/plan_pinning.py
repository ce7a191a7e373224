"""A running service keeps the sizes it was rendered with until its spec changes.

An operator release that prices steps differently (a new cost model, GPU catalog or profile) would
otherwise re-size every running service when it starts, and roll every engine pod of the fleet at once.
While `status.observedGeneration` is the spec's generation, the plan's sizes, speculation and
predictions are those `status.plan` holds, and its warnings those of the `CapacityLimited` condition;
a spec edit (a new generation) plans afresh. The reconcile and the control loop both plan through
`kept_plan`.
"""
from __future__ import annotations

from dataclasses import replace

from specfleet.operator import catalogs, planner
from specfleet.operator.api import InferenceServiceSpec
from specfleet.operator.planner import Infeasible, Plan
from specfleet.operator.status import plan_fields, plan_warnings


def kept_plan(spec: InferenceServiceSpec, status: dict, generation: int) -> Plan | Infeasible:
    """The shipped catalogs' plan of `spec`, pinned to the running sizes (`pinned`)."""
    return pinned(planner.plan(spec, catalogs.gpus(), catalogs.models(), catalogs.profiles()), status, generation)


def pinned(plan: Plan | Infeasible, status: dict, generation: int) -> Plan | Infeasible:
    """`plan` with the sizes of `status.plan` when the status observed this generation; else `plan`."""
    stored = status.get("plan")
    if not isinstance(plan, Plan) or not isinstance(stored, dict) or status.get("observedGeneration") != generation:
        return plan
    try:
        return replace(plan, **plan_fields(stored), warnings=plan_warnings(status.get("conditions") or []))
    except (KeyError, TypeError, ValueError):
        return plan
