"""The SLO planner: an InferenceService spec plus the catalogs -> a Plan, or Infeasible with a reason.

Pure: no I/O, no clock, no Kubernetes. For each tensor-parallel size the accelerator allows it sizes
the KV pool, the largest batch whose decode step meets the ITL target, the largest prefill chunk that
keeps mixed steps within the ITL target while the prompt still prefills within the TTFT target, and the
speculation depth that maximises goodput at the expected batch. It keeps the size with the best
throughput per GPU. When no size meets the SLO it says why, with the closest numbers that would work.

Step times come from the measured profile of the service's (model, accelerator) when the profile
catalogue passed in has a usable one (measured on that model and accelerator: `catalogs/profile_match.py`),
else from the roofline over the GPU catalogue's calibration (`specfleet.operator.cost`); the plan records
which and why (`Plan.calibration`).

Planning assumes the declared `minAcceptanceRate` as the acceptance rate (the controller turns
speculation off below it, so it is the worst acceptance the plan will ever run with), and sizes decode
steps at the end-of-request context `promptTokens + outputTokens`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from specfleet.operator import capacity
from specfleet.operator.api import InferenceServiceSpec
from specfleet.operator.catalogs import Gpu, GpuCatalog, ModelCatalog
from specfleet.operator.catalogs.profile_catalog import NO_PROFILES, ProfileCatalog, ProfileEntry
from specfleet.operator.catalogs.profile_match import refusal
from specfleet.operator.cost import (Architecture, Calibration, CostSource, ProfileCost, Roofline, StepCost, best_k,
                                     draft_time_fn, goodput, kv_blocks, kv_bytes_per_token, kv_pool_bytes,
                                     lora_slot_bytes, max_batch_for_speculation, max_num_seqs, no_draft_cost,
                                     planned_source, prefill_time, spec_step_time, token_budget, weights_bytes)

BLOCK_SIZE = 16
GPU_MEMORY_UTILIZATION = 0.90
TP_SIZES = (1, 2, 4, 8)
BATCH_LIMIT = 1024


@dataclass(frozen=True)
class SpeculationPlan:
    enabled: bool
    method: str | None      # None: speculation off for good (mode off)
    k: int                  # depth to use when enabled


@dataclass(frozen=True)
class Prediction:
    ttft_p99_ms: float
    itl_p99_ms: float
    tokens_per_second_per_replica: float
    max_batch_for_speculation: int


@dataclass(frozen=True)
class Plan:
    accelerator: str
    gpu_resource: str | None
    gpus_per_replica: int
    tensor_parallel_size: int
    block_size: int
    kv_cache_blocks: int
    gpu_memory_utilization: float
    max_num_seqs: int
    max_num_batched_tokens: int
    speculation: SpeculationPlan
    predicted: Prediction
    replicas: int
    weights_bytes: float
    kv_bytes_per_token: int
    warnings: tuple[str, ...] = ()     # an SLO or load the plan cannot fully honour
    profile: ProfileCost | None = None  # the measured step cost it was sized with (None: the roofline)
    calibration: CostSource = CostSource()
    lora_slot_bytes: int = 0            # adapter slots (maxLoras x maxLoraRank), taken from the KV pool


@dataclass(frozen=True)
class Infeasible:
    reason: str                         # CamelCase, for the Degraded condition
    message: str
    closest: dict[str, float] = field(default_factory=dict)   # nearest SLO values that would plan


@dataclass(frozen=True)
class _Bounds:
    """The autoscaler's fleet bounds as the speculation controller judges "free in replicas" by."""

    utilization: float
    min_replicas: int
    fixed_replicas: bool


@dataclass(frozen=True)
class _Sizing:
    """Everything fixed by one (model, GPU, TP) choice before speculation and replicas."""

    shape: Architecture
    cal: Calibration
    cost: StepCost
    tp: int
    blocks: int
    batch: int
    chunk: int
    ctx: int


def plan(spec: InferenceServiceSpec, gpus: GpuCatalog, models: ModelCatalog,
         profiles: ProfileCatalog = NO_PROFILES) -> Plan | Infeasible:
    """Plan one InferenceService; never raises for a valid spec. `profiles`: measured step costs by
    (model, accelerator); without one the roofline sizes it."""
    gpu = gpus.get(spec.accelerator.type)
    if gpu is None:
        return Infeasible("UnknownAccelerator", f"accelerator {spec.accelerator.type!r} is not in the GPU "
                          f"catalog ({', '.join(sorted(gpus))})")
    arch = models.lookup(spec.model)
    if arch is None:
        return Infeasible("UnknownModel", _unknown_model(spec.model.source))
    draft = _draft_shape(spec, models)
    if isinstance(draft, Infeasible):
        return draft
    shape = arch.with_dtype(spec.model.dtype)
    profile, source = _profile(spec, profiles, gpu, models)
    results = [_size(spec, shape, gpu, tp, profile) for tp in tp_candidates(spec, arch, gpu)]
    sized = [r for r in results if isinstance(r, _Sizing)]
    if not sized:
        return results[-1] if results else _no_tp(spec, arch, gpu)
    best = max(sized, key=lambda s: (_throughput(s) / s.tp, -s.tp))
    finished = replace(_finish(spec, gpu, best, draft), profile=profile, calibration=source)
    return _sized_like_the_autoscaler(spec, finished, gpus, models)


def _profile(spec: InferenceServiceSpec, profiles: ProfileCatalog, gpu: Gpu,
             models: ModelCatalog) -> tuple[ProfileCost | None, CostSource]:
    """The measured cost of the service's (model, accelerator), if usable, and the source it makes. A file
    that cannot be read, or was measured on another model or machine, is refused (Degraded says so); one
    measured in another dtype is not refused, only not this service's cost (there is no file per dtype)."""
    entry = profiles.lookup(spec.model, spec.accelerator.type)
    if entry is None:
        return None, planned_source(None)
    cost, why, refused = usable_profile(entry, spec, gpu, models)
    return cost, planned_source(cost, why, refused=refused)


def usable_profile(entry: ProfileEntry, spec: InferenceServiceSpec, gpu: Gpu,
                   models: ModelCatalog) -> tuple[ProfileCost | None, str, bool]:
    """The entry's cost where it may price the service; else None, why not, and whether that is a refusal
    (a file that cannot be read, or measured on another model or machine) rather than another dtype."""
    refused = entry.error or (refusal(entry.cost, entry.name, spec.model, gpu, models) if entry.cost else "")
    if refused or entry.cost is None:
        return None, refused, True
    if entry.cost.dtype not in ("", spec.model.dtype):
        # the engine runs the declared dtype (render passes it), so a profile of another one is not its cost
        return None, f"profile {entry.name} was measured in {entry.cost.dtype}; spec.model.dtype is " \
                     f"{spec.model.dtype}", False
    return entry.cost, "", False


def _unknown_model(source: str) -> str:
    if source.startswith("hostpath:"):
        folder = source.removeprefix("hostpath:").rstrip("/")
        return (f"model {source!r} is not in the model catalog and {folder}/config.json could not be read "
                "here (or lacks the architecture fields); set spec.model.architecture")
    return f"model {source!r} is not in the model catalog; set spec.model.architecture"


def tp_candidates(spec: InferenceServiceSpec, arch: Architecture, gpu: Gpu) -> list[int]:
    """Tensor-parallel sizes to try: the fixed count, or the powers of two the heads divide by."""
    if gpu.resource is None:
        return [1]
    if spec.runtime.engine == "specfleet":
        return [1] if spec.accelerator.count in (None, 1) else []
    if spec.accelerator.count is not None:
        return [spec.accelerator.count]
    return [tp for tp in TP_SIZES if tp <= gpu.max_per_node and arch.num_attention_heads % tp == 0]


def _no_tp(spec: InferenceServiceSpec, arch: Architecture, gpu: Gpu) -> Infeasible:
    if spec.runtime.engine == "specfleet":
        return Infeasible("TensorParallelUnsupported", "the specfleet engine runs one GPU per replica; "
                          "set accelerator.count to 1 or auto, or use runtime.engine: vllm")
    return Infeasible("NoTensorParallelSize", f"{arch.num_attention_heads} attention heads split evenly over "
                      f"no GPU count up to {gpu.max_per_node}")


def _size(spec: InferenceServiceSpec, shape: Architecture, gpu: Gpu, tp: int,
          profile: ProfileCost | None = None) -> _Sizing | Infeasible:
    slo, kv = spec.slo, kv_bytes_per_token(shape)
    pool = kv_pool_bytes(shape, gpu.memory_bytes, GPU_MEMORY_UTILIZATION, tp) - lora_bytes(spec, shape)
    blocks = kv_blocks(pool, BLOCK_SIZE, kv)
    if blocks * BLOCK_SIZE < slo.max_context_tokens:
        return _memory_infeasible(spec, shape, gpu, tp, blocks)
    cal, ctx = gpu.calibration(tp), min(slo.prompt_tokens + slo.output_tokens, slo.max_context_tokens)
    cost = profile if profile is not None else Roofline(shape, cal)
    itl, ttft = slo.itl_p99_ms / 1000, slo.ttft_p99_ms / 1000
    batch = max_num_seqs(cost, kv, ctx, itl, blocks * BLOCK_SIZE * kv, limit=BATCH_LIMIT)
    if batch == 0:
        floor = cost.step(1, ctx) * 1000
        return Infeasible("ITLUnreachable", f"one sequence's decode step takes {floor:.1f} ms on {tp}x "
                          f"{gpu.name}, above the {slo.itl_p99_ms:g} ms ITL target", {"itlP99Ms": _up(floor)})
    chunked = _largest_batch_with_chunk(cost, batch, ctx, slo.prompt_tokens, itl, ttft)
    if chunked is None:
        return _ttft_infeasible(spec, cost, gpu, tp, ctx)
    return _Sizing(shape, cal, cost, tp, blocks, chunked[0], chunked[1], ctx)


def _largest_batch_with_chunk(cost, batch, ctx, prompt, itl, ttft) -> tuple[int, int] | None:
    """Largest batch <= `batch` leaving room for a prefill chunk that meets both targets."""
    def budget(b: int) -> int:
        return token_budget(cost, b, ctx, prompt, itl, ttft)

    if budget(1) == 0:
        return None
    lo, hi = 1, batch + 1
    if budget(batch) > 0:
        return batch, budget(batch)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if budget(mid) > 0 else (lo, mid)
    return lo, budget(lo)


def lora_bytes(spec: InferenceServiceSpec, shape: Architecture) -> int:
    """The adapter slots' memory; 0 with LoRA off."""
    limits = spec.lora_limits
    return 0 if limits is None else lora_slot_bytes(shape, limits.max_loras, limits.max_lora_rank)


def _memory_infeasible(spec, shape, gpu, tp, blocks) -> Infeasible:
    weights = weights_bytes(shape) / 1e9
    slots = lora_bytes(spec, shape) / 1e9
    fits = blocks * BLOCK_SIZE
    closest = {"maxContextTokens": float(fits)} if fits >= 16 else {}
    adapters = f" and {slots:.2f} GB of adapter slots" if slots else ""
    return Infeasible("InsufficientMemory", f"weights {weights:.1f} GB{adapters} leave room for {fits} KV tokens "
                      f"on {tp}x {gpu.name}, fewer than maxContextTokens {spec.slo.max_context_tokens}", closest)


def _ttft_infeasible(spec, cost, gpu, tp, ctx) -> Infeasible:
    slo = spec.slo
    chunk = token_budget(cost, 1, ctx, slo.prompt_tokens, slo.itl_p99_ms / 1000, math.inf)
    if chunk == 0:
        step = cost.mixed(1, ctx, 32) * 1000
        return Infeasible("ITLUnreachable", f"a decode step carrying a prefill chunk takes {step:.1f} ms on "
                          f"{tp}x {gpu.name}, above the {slo.itl_p99_ms:g} ms ITL target", {"itlP99Ms": _up(step)})
    best = prefill_time(cost, slo.prompt_tokens, chunk, 1, ctx) * 1000
    return Infeasible("TTFTUnreachable", f"prefilling {slo.prompt_tokens} prompt tokens takes at least "
                      f"{best:.0f} ms on {tp}x {gpu.name} within the ITL target, above the "
                      f"{slo.ttft_p99_ms:g} ms TTFT target", {"ttftP99Ms": _up(best)})


def _up(ms: float) -> float:
    """Round a closest-feasible millisecond value up to one decimal."""
    return math.ceil(ms * 10) / 10


def _draft_shape(spec: InferenceServiceSpec, models: ModelCatalog):
    """The draft model's shape for the speculation method, or Infeasible for an unknown draft model."""
    sp = spec.speculation
    if sp.mode == "off" or sp.method == "ngram" or sp.draft_model is None:
        return None
    arch = models.lookup(sp.draft_model)
    if arch is None:
        return Infeasible("UnknownDraftModel", f"draft model {sp.draft_model.source!r} is not in the model "
                          "catalog; set speculation.draftModel.architecture")
    return arch.with_dtype(sp.draft_model.dtype)


def _throughput(s: _Sizing) -> float:
    return s.batch / s.cost.step(s.batch, s.ctx)


def _finish(spec: InferenceServiceSpec, gpu: Gpu, s: _Sizing, draft_shape) -> Plan:
    slo, sp = spec.slo, spec.speculation
    draft = draft_time_fn(draft_shape, s.shape, s.cal, s.ctx) if draft_shape is not None else no_draft_cost
    ttft_s = prefill_time(s.cost, slo.prompt_tokens, s.chunk, s.batch, s.ctx)
    itl_s = s.cost.mixed(s.batch, s.ctx, s.chunk)
    replicas, warnings, op_batch = _load(spec, s.batch, ttft_s + slo.output_tokens * itl_s)
    mbs = max_batch_for_speculation(s.cost, s.ctx, sp.min_acceptance_rate, sp.max_speculative_tokens,
                                    limit=4 * BATCH_LIMIT, draft=draft) if sp.mode != "off" else 0
    spec_plan = _speculation(spec, s, op_batch, draft)
    if spec_plan.enabled:
        spec_step = spec_step_time(s.cost, op_batch, s.ctx, spec_plan.k, draft)
        itl_s = max(itl_s, spec_step)
        if spec_step * 1000 > slo.itl_p99_ms:
            warnings += (f"speculation forced on: a k={spec_plan.k} step takes {spec_step * 1000:.1f} ms, "
                         f"above the {slo.itl_p99_ms:g} ms ITL target",)
    k_at_max = spec_plan.k if spec_plan.enabled and s.batch <= mbs else 0
    tps = goodput(s.cost, s.batch, s.ctx, sp.min_acceptance_rate, k_at_max, draft)
    return Plan(accelerator=gpu.name, gpu_resource=gpu.resource, gpus_per_replica=s.tp, tensor_parallel_size=s.tp,
                block_size=BLOCK_SIZE, kv_cache_blocks=s.blocks, gpu_memory_utilization=GPU_MEMORY_UTILIZATION,
                max_num_seqs=s.batch, max_num_batched_tokens=s.chunk, speculation=spec_plan,
                predicted=Prediction(round(ttft_s * 1000, 1), round(itl_s * 1000, 1), round(tps, 1), mbs),
                replicas=replicas, weights_bytes=weights_bytes(s.shape),
                kv_bytes_per_token=kv_bytes_per_token(s.shape), warnings=warnings,
                lora_slot_bytes=lora_bytes(spec, s.shape))


def _sized_like_the_autoscaler(spec: InferenceServiceSpec, plan: Plan, gpus: GpuCatalog,
                               models: ModelCatalog) -> Plan:
    """The plan with its replicas for the declared load counted as the autoscaler counts them (requests/s
    per replica at its target utilization, by slots and by prefill rate) and speculation where the
    speculation controller would keep it: on, at the deepest k that costs no replicas at the declared
    load (draft tokens to verify take prompt budget), else off until the controller sees it pay."""
    slo, sp = spec.slo, spec.speculation
    model = capacity.service_model(spec, plan, gpus, models)
    if model is None:
        return plan
    u = capacity.TARGET_UTILIZATION
    if plan.speculation.enabled and sp.mode == "auto":
        bounds = _Bounds(u, spec.autoscaling.min_replicas, spec.replicas is not None)
        k = capacity.free_k(model, bounds, slo.requests_per_second, sp.min_acceptance_rate, plan.speculation.k,
                            serving=spec.replicas or 0)
        plan = replace(plan, speculation=replace(plan.speculation, enabled=k >= 1, k=k or plan.speculation.k))
    per = model.replica_rps(u)
    if plan.speculation.enabled:
        per = max(per, model.replica_rps(u, sp.min_acceptance_rate, plan.speculation.k))
    needed = capacity.replicas_for(slo.requests_per_second, per)
    if needed <= plan.replicas and spec.replicas is None:
        return plan
    replicas, warnings = _replicas(spec, max(needed, plan.replicas))
    return replace(plan, replicas=replicas, warnings=tuple(w for w in plan.warnings if "replicas" not in w) + warnings)


def _load(spec: InferenceServiceSpec, batch: int, per_request_s: float) -> tuple[int, tuple[str, ...], int]:
    """Replicas for the declared load (Little's law), their warnings, and the expected batch per replica."""
    in_flight = spec.slo.requests_per_second * per_request_s
    replicas, warnings = _replicas(spec, max(1, math.ceil(in_flight / batch)))
    return replicas, warnings, max(1, min(batch, math.ceil(in_flight / max(replicas, 1))))


def _replicas(spec: InferenceServiceSpec, needed: int) -> tuple[int, tuple[str, ...]]:
    """Initial replicas for the declared load: fixed `spec.replicas`, else `needed` within min/max."""
    auto = spec.autoscaling
    fixed = spec.replicas
    if fixed is not None:
        short = fixed < needed
        return fixed, ((f"the declared load needs {needed} replicas, spec.replicas is {fixed}",) if short else ())
    replicas = min(max(needed, auto.min_replicas), auto.max_replicas)
    if needed > auto.max_replicas:
        return replicas, (f"the declared load needs {needed} replicas, maxReplicas is {auto.max_replicas}",)
    return replicas, ()


def _speculation(spec: InferenceServiceSpec, s: _Sizing, op_batch: int, draft) -> SpeculationPlan:
    sp, itl = spec.speculation, spec.slo.itl_p99_ms / 1000
    if sp.mode == "off":
        return SpeculationPlan(False, None, 0)
    k_at = lambda b: best_k(s.cost, b, s.ctx, sp.min_acceptance_rate, sp.max_speculative_tokens, draft)  # noqa: E731
    k_op = k_at(op_batch)
    if sp.mode == "on":
        return SpeculationPlan(True, sp.method, max(1, k_op or k_at(1)))
    fits = k_op > 0 and spec_step_time(s.cost, op_batch, s.ctx, k_op, draft) <= itl
    return SpeculationPlan(fits, sp.method, k_op if fits else k_at(1))
