"""Status of an InferenceService: Plan / Infeasible / invalid spec / rollout -> a status patch.

Pure: the caller passes the previous conditions and the time, so a condition keeps its
`lastTransitionTime` until its status actually changes. Condition types are Ready, Progressing,
Degraded, SLOMet and SpeculationActive (docs/design.md). `status.calibration` says where the step
costs come from (`calibration_dict`): the plan's choice at reconcile, the control loop's refinement after.
"""
from __future__ import annotations

from typing import Iterable, Sequence

from specfleet.operator.api import CONDITION_TYPES, Condition
from specfleet.operator.planner import Infeasible, Plan, Prediction, SpeculationPlan
from specfleet.operator.cost import CostSource

TRUE, FALSE, UNKNOWN = "True", "False", "Unknown"


def plan_dict(plan: Plan) -> dict:
    """`status.plan` exactly as the CRD declares it."""
    sp, pr = plan.speculation, plan.predicted
    out = {"gpusPerReplica": plan.gpus_per_replica, "tensorParallelSize": plan.tensor_parallel_size,
           "blockSize": plan.block_size, "kvCacheBlocks": plan.kv_cache_blocks,
           "gpuMemoryUtilization": plan.gpu_memory_utilization, "maxNumSeqs": plan.max_num_seqs,
           "maxNumBatchedTokens": plan.max_num_batched_tokens,
           "speculation": {"enabled": sp.enabled, "method": sp.method or "none", "k": sp.k},
           "predicted": {"ttftP99Ms": pr.ttft_p99_ms, "itlP99Ms": pr.itl_p99_ms,
                         "tokensPerSecondPerReplica": pr.tokens_per_second_per_replica,
                         "maxBatchForSpeculation": pr.max_batch_for_speculation}}
    if plan.lora_slot_bytes:
        out["loraSlotBytes"] = plan.lora_slot_bytes
    return out


def plan_fields(stored: dict) -> dict:
    """The `Plan` fields `status.plan` holds (`plan_dict`'s inverse); KeyError, TypeError or ValueError on a
    malformed one."""
    sp, pr = stored["speculation"], stored["predicted"]
    return {"gpus_per_replica": int(stored["gpusPerReplica"]),
            "tensor_parallel_size": int(stored["tensorParallelSize"]),
            "block_size": int(stored["blockSize"]), "kv_cache_blocks": int(stored["kvCacheBlocks"]),
            "gpu_memory_utilization": float(stored["gpuMemoryUtilization"]),
            "max_num_seqs": int(stored["maxNumSeqs"]), "max_num_batched_tokens": int(stored["maxNumBatchedTokens"]),
            "speculation": SpeculationPlan(bool(sp["enabled"]), None if sp["method"] == "none" else sp["method"],
                                           int(sp["k"])),
            "predicted": Prediction(float(pr["ttftP99Ms"]), float(pr["itlP99Ms"]),
                                    float(pr["tokensPerSecondPerReplica"]), int(pr["maxBatchForSpeculation"])),
            "lora_slot_bytes": int(stored.get("loraSlotBytes", 0))}


def plan_warnings(conditions: Sequence[dict]) -> tuple[str, ...]:
    """The warnings a plan was written with: its `CapacityLimited` Degraded condition's (`_degraded`)."""
    degraded = _condition(conditions, "Degraded") or {}
    return tuple(degraded["message"].split("; ")) if degraded.get("reason") == CAPACITY_LIMITED else ()


def calibration_dict(source: CostSource) -> dict:
    """`status.calibration`: {source: profile|online|roofline, profile, fitError, samples[, reason]}."""
    return source.as_status()


def planned(result: Plan | Infeasible, generation: int, selector: str, previous: Sequence[dict],
            now: str, adapter_problems: Sequence[str] = ()) -> dict:
    """The status patch after planning (and, for a Plan, applying) generation `generation`;
    `adapter_problems`: declared adapters that cannot be served (`adapters.problems`)."""
    if isinstance(result, Infeasible):
        return _infeasible(result, generation, selector, previous, now)
    conditions = [_degraded(result, adapter_problems), Condition("Progressing", TRUE, "Reconciled",
                                               f"rendered plan for generation {generation}")]
    # SLOMet and SpeculationActive belong to the control loop once it has reported (same generation).
    conditions += [c for c in (_slo_pending(result), _speculation(result))
                   if not _controller_owned(_condition(previous, c.type), generation)]
    return {"observedGeneration": generation, "phase": "Progressing", "plan": plan_dict(result),
            "calibration": calibration_dict(result.calibration),
            "desiredReplicas": result.replicas, "selector": selector,
            "conditions": merge_conditions(previous, conditions, now, generation)}


def invalid(errors: Iterable[str], generation: int, previous: Sequence[dict], now: str) -> dict:
    """The status patch for a spec that breaks the CRD's rules (a cluster without CEL let it in)."""
    message = "; ".join(errors)
    conditions = [Condition("Degraded", TRUE, "InvalidSpec", message),
                  Condition("Ready", FALSE, "InvalidSpec", "the spec is invalid; nothing was changed"),
                  Condition("Progressing", FALSE, "InvalidSpec", message)]
    return {"observedGeneration": generation, "phase": "Failed",
            "conditions": merge_conditions(previous, conditions, now, generation)}


def forbidden(message: str, generation: int, previous: Sequence[dict], now: str) -> dict:
    """The status patch when the API refused a write or read (RBAC): Degraded, reason Forbidden."""
    conditions = [Condition("Degraded", TRUE, "Forbidden", f"missing RBAC permission: {message}")]
    return {"phase": "Degraded", "conditions": merge_conditions(previous, conditions, now, generation)}


def rollout(desired: int, replicas: int, ready: int, previous: Sequence[dict], now: str,
            generation: int | None = None) -> dict:
    """Ready/Progressing from the Deployment's replica counts."""
    degraded = _condition(previous, "Degraded")
    failed = degraded is not None and degraded.get("status") == TRUE and degraded.get("reason") in (
        "InvalidSpec", "Infeasible", "UnknownModel", "UnknownAccelerator")
    done = ready >= desired and replicas == desired
    ready_reason = "ReplicasReady" if done else "ReplicasNotReady"
    ready_message = f"{ready}/{desired} replicas ready"
    if done and desired == 0:
        ready_reason, ready_message = "ScaledToZero", "0 replicas; requests held by the gateway scale it up"
    conditions = [Condition("Ready", TRUE if done and ready > 0 else FALSE, ready_reason, ready_message),
                  Condition("Progressing", FALSE if done else TRUE,
                            "RolloutComplete" if done else "RollingOut", f"{ready}/{desired} replicas ready")]
    phase = "Failed" if failed else ("Ready" if done and ready > 0 else "Progressing")
    if done and degraded is not None and degraded.get("status") == TRUE and not failed:
        phase = "Degraded"
    return {"replicas": replicas, "readyReplicas": ready, "phase": phase,
            "conditions": merge_conditions(previous, conditions, now, generation)}


def merge_conditions(previous: Sequence[dict], updates: Iterable[Condition], now: str,
                     generation: int | None) -> list[dict]:
    """Previous conditions with `updates` applied; lastTransitionTime moves only on a status change."""
    merged = {c["type"]: dict(c) for c in previous if "type" in c}
    for cond in updates:
        old = merged.get(cond.type)
        changed = old is None or old.get("status") != cond.status
        entry = {**cond.as_dict(), "lastTransitionTime": now if changed else old.get("lastTransitionTime", now)}
        if generation is not None:
            entry["observedGeneration"] = generation
        elif old is not None and "observedGeneration" in old:
            entry["observedGeneration"] = old["observedGeneration"]
        merged[cond.type] = entry
    return sorted(merged.values(), key=lambda c: _ORDER.get(c["type"], 99))


_ORDER = {t: i for i, t in enumerate(CONDITION_TYPES)}
MAX_DECISIONS = 20                  # status.lastDecisions keeps the latest this many


CONTROLLER_REASONS = frozenset({"Observed", "Missed", "MetricsUnavailable", "LowAcceptance", "BatchAboveThreshold",
                                "SpeculationPays", "Reprobe", "DepthRetuned", "Paying", "NotPaying", "Dwell",
                                "NoAcceptanceEvidence", "Forced"})


def _controller_owned(cond: dict | None, generation: int) -> bool:
    """A condition the control loop set (its reasons) since this generation was planned."""
    return (cond is not None and cond.get("reason") in CONTROLLER_REASONS
            and cond.get("observedGeneration", generation) == generation)


def _condition(conditions: Sequence[dict], kind: str) -> dict | None:
    return next((c for c in conditions if c.get("type") == kind), None)


def _infeasible(result: Infeasible, generation: int, selector: str, previous: Sequence[dict], now: str) -> dict:
    closest = ", ".join(f"{k}={v:g}" for k, v in result.closest.items())
    message = result.message + (f"; closest feasible: {closest}" if closest else "")
    conditions = [Condition("Degraded", TRUE, result.reason, message),
                  Condition("SLOMet", FALSE, result.reason, message),
                  Condition("Ready", FALSE, "Infeasible", "no plan meets the SLO; nothing was deployed"),
                  Condition("Progressing", FALSE, "Infeasible", message),
                  Condition("SpeculationActive", FALSE, "Infeasible", "no plan")]
    return {"observedGeneration": generation, "phase": "Failed", "selector": selector,
            "conditions": merge_conditions(previous, conditions, now, generation)}


ADAPTER_FAILED = "AdapterFailed"
CAPACITY_LIMITED = "CapacityLimited"     # the plan's warnings: an SLO or load it cannot fully honour
PROFILE_REFUSED = "ProfileRefused"
PROFILE_HOST_MISMATCH = "ProfileHostMismatch"
FEASIBLE = Condition("Degraded", FALSE, "PlanFeasible", "the plan meets the declared SLO")


def _degraded(plan: Plan, adapter_problems: Sequence[str] = ()) -> Condition:
    if plan.warnings:
        return Condition("Degraded", TRUE, CAPACITY_LIMITED, "; ".join(plan.warnings))
    if adapter_problems:
        return Condition("Degraded", TRUE, ADAPTER_FAILED, "; ".join(adapter_problems))
    if plan.calibration.refused:
        return Condition("Degraded", TRUE, PROFILE_REFUSED, profile_refused(plan))
    return FEASIBLE


def profile_refused(plan: Plan) -> str:
    """The message of a refused profile: why, and what sized the plan instead."""
    return f"{plan.calibration.reason}; the roofline prices the steps instead"


def adapter_degraded(previous: Sequence[dict], adapter_problems: Sequence[str]) -> Condition | None:
    """Degraded as the adapter sync sees it, the way `planned` decides it: AdapterFailed while an adapter
    cannot be served and the plan itself is fine; back to PlanFeasible once none fails. None: leave it
    (a planner reason, or nothing changed)."""
    current = _condition(previous, "Degraded") or {}
    reason = current.get("reason")
    if adapter_problems and reason in (None, FEASIBLE.reason, ADAPTER_FAILED):
        return Condition("Degraded", TRUE, ADAPTER_FAILED, "; ".join(adapter_problems))
    if not adapter_problems and reason == ADAPTER_FAILED:
        return FEASIBLE
    return None


def host_degraded(previous: Sequence[dict], mismatch: str) -> Condition | None:
    """Degraded as the control loop's host check sees it (`control/profile_host.py`), as `adapter_degraded`
    decides its own: ProfileHostMismatch while the engines run on a CPU that no profile of the service was
    measured on and the plan is otherwise fine; back to PlanFeasible once one prices them. None: leave it."""
    reason = (_condition(previous, "Degraded") or {}).get("reason")
    if mismatch and reason in (None, FEASIBLE.reason, PROFILE_HOST_MISMATCH):
        return Condition("Degraded", TRUE, PROFILE_HOST_MISMATCH, mismatch)
    if not mismatch and reason == PROFILE_HOST_MISMATCH:
        return FEASIBLE
    return None


def _slo_pending(plan: Plan) -> Condition:
    pr = plan.predicted
    return Condition("SLOMet", UNKNOWN, "AwaitingMetrics",
                     f"predicted TTFT p99 {pr.ttft_p99_ms:g} ms, ITL p99 {pr.itl_p99_ms:g} ms")


def _speculation(plan: Plan) -> Condition:
    sp, mbs = plan.speculation, plan.predicted.max_batch_for_speculation
    if sp.method is None:
        return Condition("SpeculationActive", FALSE, "Disabled", "speculation.mode is off")
    if sp.enabled:
        return Condition("SpeculationActive", TRUE, "Planned",
                         f"{sp.method} k={sp.k}; pays up to batch {mbs}")
    return Condition("SpeculationActive", FALSE, "NotPaying",
                     f"{sp.method} pays up to batch {mbs}, below the expected batch; k={sp.k} when re-enabled")


def rebase(patch: dict, read: dict, current: dict) -> dict:
    """`patch`, made from the status its writer read (`read`), made again on the status the server holds
    now (`current`), which another writer changed since: the patch replaces the `conditions` and
    `lastDecisions` lists whole, so as it stands it would undo that writer's entries. Conditions: the
    current ones, with those the patch changed from `read`'s; decisions: the current ones, then those the
    patch added (the last `MAX_DECISIONS`). The fields a patch sets whole are its writer's own."""
    rebased = dict(patch)
    if "conditions" in patch:
        before = {c.get("type"): c for c in read.get("conditions") or []}
        merged = {c["type"]: c for c in current.get("conditions") or [] if "type" in c}
        merged.update({c["type"]: c for c in patch["conditions"] if before.get(c.get("type")) != c})
        rebased["conditions"] = sorted(merged.values(), key=lambda c: _ORDER.get(c["type"], 99))
    if "lastDecisions" in patch:
        before = read.get("lastDecisions") or []
        added = [d for d in patch["lastDecisions"] if d not in before]
        rebased["lastDecisions"] = ((current.get("lastDecisions") or []) + added)[-MAX_DECISIONS:]
    return rebased


def changes(old: dict, patch: dict) -> bool:
    """Whether merging `patch` into the status `old` changes anything but condition timestamps (the one
    test before a status write: an unchanged status is not written)."""
    def strip(s: dict) -> dict:
        conds = [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in s.get("conditions") or []]
        return {**{k: v for k, v in s.items() if k in patch}, "conditions": conds}
    return strip(old) != strip(patch)
