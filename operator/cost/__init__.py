"""The cost of serving: how long an engine step takes, what speculation gains, how a replica's memory
splits, and how those estimates are calibrated against what the engines do.

One interface, `StepCost` (`interface.py`): the time of a decode, a verify and a mixed (prefill) step
at a batch and context. Two implementations: `Roofline` (`roofline.py`, from the model's shape and the
GPU's effective bandwidth and FLOP/s) and `ProfileCost` (`profile.py`, a measured engine profile read as
plain data). One calibration (`calibration.py`): the roofline fit and the online refinement of either
cost from observed steps. The planner, the control loop and the simulator all price steps through it.

    shapes.py       Architecture (the CRD's spec.model.architecture too), dtype sizes
    memory.py       weights, KV per token, KV pool and blocks, LoRA adapter slots
    speculation.py  tokens per step, goodput, k*, maxBatchForSpeculation, break-even batch
    sizing.py       the ITL batch, the token budget, prefill time
    observed.py     observed steps against a cost (prediction, fit error)
    source.py       CostSource: where a service's costs come from (`status.calibration`)

Pure and torch-free, numpy-free: the operator's image has neither.
"""
from specfleet.operator.cost.calibration import StepSample, fit_calibration, recalibrate, recalibrate_from
from specfleet.operator.cost.interface import StepCost
from specfleet.operator.cost.memory import (GiB, kv_blocks, kv_bytes_per_token, kv_pool_bytes, lora_slot_bytes,
                                            weights_bytes)
from specfleet.operator.cost.observed import ObservedStep, fit_error, predicted
from specfleet.operator.cost.profile import ProfileCost, profile_cost, refine, verifying_share
from specfleet.operator.cost.roofline import Calibration, Roofline, mixed_step_time, step_time
from specfleet.operator.cost.shapes import Architecture, dtype_bytes
from specfleet.operator.cost.sizing import max_num_seqs, prefill_time, token_budget
from specfleet.operator.cost.source import CostSource, planned_source
from specfleet.operator.cost.speculation import (DraftTime, Share, alpha_from_acceptance, best_k, break_even_batch,
                                                 draft_time_fn, expected_tokens, goodput, goodputs,
                                                 max_batch_for_speculation, no_draft_cost, share_at, share_per_step,
                                                 share_per_token, spec_step_time)

__all__ = ["Architecture", "Calibration", "CostSource", "DraftTime", "GiB", "ObservedStep", "ProfileCost",
           "Roofline", "Share", "StepCost", "StepSample", "alpha_from_acceptance", "best_k", "break_even_batch",
           "draft_time_fn", "dtype_bytes", "expected_tokens", "fit_calibration", "fit_error", "goodput", "goodputs",
           "kv_blocks", "kv_bytes_per_token", "kv_pool_bytes", "lora_slot_bytes", "max_batch_for_speculation", "max_num_seqs",
           "mixed_step_time", "no_draft_cost", "planned_source", "predicted", "prefill_time", "profile_cost",
           "recalibrate", "recalibrate_from", "refine", "share_at", "share_per_step", "share_per_token",
           "spec_step_time", "step_time", "token_budget", "verifying_share", "weights_bytes"]
