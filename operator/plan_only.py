"""PlanOnly mode: what the operator would do in Serving mode, written down instead of done.

`planned_actions` compares the objects reconciliation would apply with the live ones (pure: the caller
reads them) and says, one line each, what Serving mode would create, correct or leave alone. A workload
left running by an earlier Serving generation is never deleted or changed in PlanOnly: the operator says
it is there and stops managing it (no scaling, no speculation switches) until the mode is Serving again.
"""
from __future__ import annotations

from typing import Callable

from specfleet.operator import status
from specfleet.operator.api import Condition
from specfleet.operator.kube import is_subset

MAX_ACTIONS = 32


def planned_actions(desired: list[dict], live: Callable[[str, str], dict | None], replicas: int) -> list[str]:
    """One line per object: `create Deployment chat (2 replicas)`, `update Service chat (drifted)`, or
    for a running workload `leave Deployment chat running (...)`."""
    out = []
    for manifest in desired:
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        current = live(kind, name)
        what = f"{kind} {name}"
        if current is None:
            count = f" ({replicas} replica{'s' if replicas != 1 else ''})" if kind == "Deployment" else ""
            out.append(f"create {what}{count}")
        elif kind == "Deployment":
            running = (current.get("spec") or {}).get("replicas", 0)
            out.append(f"leave {what} running with {running} replicas, not managed while PlanOnly"
                       + ("" if is_subset(manifest, current) else f"; Serving would update it ({replicas} replicas)"))
        elif not is_subset(manifest, current) and kind != "Secret":
            out.append(f"update {what} (differs from the plan)")
    return out[:MAX_ACTIONS]


def plan_only_status(patch: dict, actions: list[str], generation: int, now: str) -> dict:
    """The planned status patch of a PlanOnly service: the actions, phase Pending, not Ready."""
    message = "PlanOnly: " + ("; ".join(actions) if actions else "nothing to do")
    conditions = [Condition("Ready", "False", "PlanOnly", "mode is PlanOnly: the operator creates nothing"),
                  Condition("Progressing", "False", "PlanOnly", message[:1000])]
    return {**patch, "phase": "Pending", "plannedActions": actions,
            "conditions": status.merge_conditions(patch["conditions"], conditions, now, generation)}
