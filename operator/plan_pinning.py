"""A running service keeps the sizes it was rendered with until its spec changes.

An operator release that prices steps differently (a new cost model, GPU catalog or profile) would
otherwise re-size every running service when it starts, and roll every engine pod of the fleet at once.
While `status.observedGeneration` is the spec's generation, the plan's sizes, speculation and
predictions are those `status.plan` holds, and its warnings those of the `CapacityLimited` condition;
a spec edit (a new generation) plans afresh.
"""
from __future__ import annotations

from dataclasses import replace

from specfleet.operator.planner import Infeasible, Plan, Prediction, SpeculationPlan
from specfleet.operator.status import CAPACITY_LIMITED


def pinned(plan: Plan | Infeasible, status: dict, generation: int) -> Plan | Infeasible:
    """`plan` with the sizes of `status.plan` when the status observed this generation; else `plan`."""
    stored = status.get("plan")
    if not isinstance(plan, Plan) or not isinstance(stored, dict) or status.get("observedGeneration") != generation:
        return plan
    try:
        return replace(plan, **_sizes(stored), warnings=_warnings(status))
    except (KeyError, TypeError, ValueError):
        return plan


def _warnings(status: dict) -> tuple[str, ...]:
    """The warnings the stored plan was rendered with, from its Degraded condition."""
    degraded = next((c for c in status.get("conditions") or [] if c.get("type") == "Degraded"), {})
    return tuple(degraded["message"].split("; ")) if degraded.get("reason") == CAPACITY_LIMITED else ()


def _sizes(stored: dict) -> dict:
    """Plan fields from `status.plan` (`status.plan_dict`'s inverse)."""
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
