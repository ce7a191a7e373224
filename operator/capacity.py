"""Capacity sizing, shared by the planner and the control loop: what one replica carries at the SLO.

`ServiceModel` bundles a service's model shape, step cost, SLO and plan limits and answers the
sizing questions (the batch that holds the ITL target, requests/s per replica at a utilization,
goodput-optimal k, maxBatchForSpeculation); `service_model` builds it from a spec and its plan's
limits; `free_k` is the search for the deepest speculation depth that costs no replicas at a load;
`replicas_for` counts replicas for a load. Every step time comes from the model's `cost`: its measured
profile when the plan found one for the service's (model, accelerator), else the roofline over `cal`
(`specfleet.operator.cost`). Pure: it imports only the cost package, so the planner (above it) and the
controllers (above it) both use it and neither imports the other.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Protocol

from specfleet.operator.cost import (Architecture, Calibration, CostSource, DraftTime, ProfileCost, Roofline, Share,
                                     StepCost, best_k, draft_time_fn, expected_tokens, goodputs,
                                     max_batch_for_speculation, no_draft_cost, share_at, spec_step_time)

TARGET_UTILIZATION = 0.9    # share of the SLO batch and of the prefill rate a replica is sized to use


@dataclass(frozen=True)
class ServiceModel:
    shape: Architecture        # at the service's dtype
    cal: Calibration
    prior: Calibration
    ctx: int                   # mean context of a decoding sequence
    prompt_tokens: int
    output_tokens: int
    ttft_s: float
    itl_s: float
    max_num_seqs: int
    chunk: int                 # max_num_batched_tokens
    max_k: int
    min_acceptance: float
    draft: DraftTime = no_draft_cost
    profile: ProfileCost | None = None          # the measured cost; None: the roofline over `cal`
    calibration: CostSource = CostSource()      # where `cost` comes from and how well it fits
    # Drafted tokens per k decoding sequence-steps: one share, or one per depth 1, 2, ... (an n-gram
    # proposal is often shorter than k, so the share falls with k).
    draft_share: Share = 1.0

    @property
    def cost(self) -> StepCost:
        return self.profile if self.profile is not None else Roofline(self.shape, self.cal)

    def step(self, batch: float, k: int = 0) -> float:
        return spec_step_time(self.cost, max(1, round(batch)), self.ctx, k, self.draft, self.draft_share)

    def tokens_per_step(self, alpha: float, k: int) -> float:
        """Mean tokens a decoding sequence gains per step at acceptance `alpha` and depth `k`."""
        return expected_tokens(alpha, k, self.draft_share)

    def slo_batch(self, alpha: float = 0.0, k: int = 0) -> int:
        """Largest batch whose mixed step keeps tokens within the ITL target (at most max_num_seqs)."""
        return _slo_batch(self, alpha, k)

    def request_seconds(self, batch: float, alpha: float = 0.0, k: int = 0, output: float | None = None) -> float:
        """Time one request occupies a batch slot: prefill plus its output tokens at `batch`, on a
        replica busy enough that its steps also prefill (the steps of a replica near its capacity)."""
        out = self.output_tokens if output is None else output
        step = max(self.step(batch, k), self.mixed_step(batch))
        prefill = math.ceil(self.prompt_tokens / self.prefill_room(batch, k)) * step
        return prefill + out * step / self.tokens_per_step(alpha, k)

    def replica_rps(self, utilization: float, alpha: float = 0.0, k: int = 0, output: float | None = None) -> float:
        """Requests/s one replica sustains with at most `utilization` of its SLO batch busy and of its
        prefill rate used (less where the TTFT target leaves less room for queueing:
        `prefill_utilization`), at the batch that load itself makes (Little's law: batch = rate x the
        time a request holds a slot). A prefill-bound replica runs a batch well under its SLO batch,
        and a smaller batch leaves more of the token budget to prompts."""
        return _replica_rps(self, round(utilization, 4), round(alpha, 4), k,
                            None if output is None else round(output, 1))

    def prefill_utilization(self, batch: float, k: int = 0, cap: float = 1.0) -> float:
        """Share of its prefill rate a replica can use with the TTFT p99 target held: prompts queue for
        prefill, and with a service time s per prompt the p99 wait at utilization p is about
        ln(100)/2 x p s / (1 - p) (the exponential tail of the M/D/1 wait), which must fit in the
        target minus the prompt's own prefill. At most `cap`."""
        s = 1.0 / max(self.prefill_rps(batch, k), 1e-9)
        budget = self.queueing_budget(batch, k)
        if budget <= 0:
            return min(cap, 0.05)
        return min(cap, budget / (budget + math.log(100) / 2 * s))

    def queue_allowance(self, batch: float, k: int = 0) -> float:
        """Prompts one replica prefills within the TTFT target less a prompt's own prefill: a waiting
        queue longer than this per replica misses the target; a few waiting prompts are just Poisson
        arrivals at a busy prefill (about p^2 / 2(1 - p) on average at utilization p)."""
        return max(0.0, self.queueing_budget(batch, k)) * self.prefill_rps(batch, k)

    def queueing_budget(self, batch: float, k: int = 0) -> float:
        """Seconds a prompt may wait for prefill: the TTFT target less the prompt's own chunked prefill."""
        return self.ttft_s - math.ceil(self.prompt_tokens / self.prefill_room(batch, k)) * self.mixed_step(batch)

    def prefill_rps(self, batch: float, k: int = 0) -> float:
        """Prompts/s one replica prefills while decoding `batch` sequences (the token budget's spare room)."""
        return self.prefill_room(batch, k) / self.mixed_step(batch) / self.prompt_tokens

    def prefill_room(self, batch: float, k: int = 0) -> int:
        """Prompt tokens a step has room for next to `batch` running sequences: the engine schedules the
        running ones first, each taking its token plus k draft tokens to verify."""
        return max(self.chunk - round(max(1, round(batch)) * (1 + self.share_at(k) * k)), 1)

    def mixed_step(self, batch: float) -> float:
        return self.cost.mixed(max(1, round(batch)), self.ctx, self.chunk)

    def best_k(self, batch: float, alpha: float, margin: float = 0.0) -> int:
        return best_k(self.cost, max(1, round(batch)), self.ctx, alpha, self.max_k, self.draft, self.draft_share,
                      margin)

    def speedup(self, batch: float, alpha: float) -> tuple[float, int]:
        """Goodput speculating at the best depth over goodput without, at `batch` (below 1: it costs),
        and that depth."""
        rates = goodputs(self.cost, max(1, round(batch)), self.ctx, alpha, max(self.max_k, 1), self.draft,
                         self.draft_share)
        k = max(range(1, len(rates)), key=lambda i: (rates[i], -i))
        return rates[k] / rates[0], k

    def share_at(self, k: int) -> float:
        return share_at(self.draft_share, k)

    def with_draft_share(self, share: Share | None) -> "ServiceModel":
        """The model at an observed draft share, or shares by depth (rounded, so that the sizing caches
        stay small)."""
        if share is None:
            return self
        if isinstance(share, (int, float)):
            return replace(self, draft_share=max(0.05, round(share, 2)))
        return replace(self, draft_share=tuple(max(0.05, round(s, 2)) for s in share))

    def max_batch_for_speculation(self, alpha: float, margin: float = 0.0) -> int:
        """The largest batch where speculation's goodput beats plain decoding's by `margin` (a share)."""
        return _mbs(self, round(alpha, 3), round(margin, 3))


@lru_cache(maxsize=4096)
def _slo_batch(m: ServiceModel, alpha: float, k: int) -> int:
    mixed_ok = m.mixed_step(1) <= m.itl_s

    def fits(b: int) -> bool:
        # When the token budget alone breaks the ITL target (a plan sized for a faster calibration),
        # no batch fixes that: size by plain decode steps instead of collapsing to one sequence.
        mixed = m.mixed_step(b) if k == 0 and mixed_ok else m.step(b, k)
        return mixed / m.tokens_per_step(alpha, k) <= m.itl_s
    if not fits(1):
        return 1
    lo, hi = 1, max(1, m.max_num_seqs)
    if fits(hi):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


@lru_cache(maxsize=4096)
def _replica_rps(m: ServiceModel, utilization: float, alpha: float, k: int, output: float | None) -> float:
    top = max(1.0, utilization * m.slo_batch(alpha, k))

    def by_slots(b: float) -> float:
        return b / m.request_seconds(b, alpha, k, output)

    def by_prefill(b: float) -> float:
        return m.prefill_utilization(b, k, utilization) * m.prefill_rps(b, k)
    if by_slots(top) <= by_prefill(top):
        return by_slots(top)
    # Slots grow with the batch and the prefill rate shrinks with it: the rate is where they cross.
    lo, hi = 1.0, top
    for _ in range(24):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if by_slots(mid) < by_prefill(mid) else (lo, mid)
    return min(by_slots(lo), by_prefill(lo))


@lru_cache(maxsize=1024)
def _mbs(m: ServiceModel, alpha: float, margin: float) -> int:
    return max_batch_for_speculation(m.cost, m.ctx, alpha, m.max_k, limit=4096, draft=m.draft, share=m.draft_share,
                                     margin=margin)






def service_model(spec, plan, gpus, models) -> ServiceModel | None:
    """The ServiceModel of a planned InferenceService (None when its model or GPU is unknown), on the
    step cost its plan was sized with (`plan.profile`, else the roofline)."""
    gpu, arch = gpus.get(plan.accelerator), models.lookup(spec.model)
    if gpu is None or arch is None:
        return None
    shape = arch.with_dtype(spec.model.dtype)
    cal = gpu.calibration(plan.tensor_parallel_size)
    slo, sp = spec.slo, spec.speculation
    ctx = min(slo.prompt_tokens + slo.output_tokens // 2, slo.max_context_tokens)
    draft = no_draft_cost
    if sp.method == "draft" and sp.draft_model is not None and models.lookup(sp.draft_model) is not None:
        draft = draft_time_fn(models.lookup(sp.draft_model).with_dtype(sp.draft_model.dtype), shape, cal, ctx)
    return ServiceModel(shape=shape, cal=cal, prior=cal, ctx=ctx, prompt_tokens=slo.prompt_tokens,
                        output_tokens=slo.output_tokens, ttft_s=slo.ttft_p99_ms / 1000, itl_s=slo.itl_p99_ms / 1000,
                        max_num_seqs=_engine_arg(spec, "--max-num-seqs", plan.max_num_seqs),
                        chunk=_engine_arg(spec, "--max-num-batched-tokens", plan.max_num_batched_tokens),
                        max_k=sp.max_speculative_tokens if sp.mode != "off" else 0,
                        min_acceptance=sp.min_acceptance_rate, draft=draft,
                        profile=plan.profile, calibration=plan.calibration)


def _engine_arg(spec, flag: str, planned: int) -> int:
    """The engine's value of an integer flag: `runtime.extraArgs` come after the plan's args, so the last
    occurrence there (`--flag N` or `--flag=N`) is what the engine runs with; else the plan's."""
    args, value = list(spec.runtime.extra_args), planned
    for i, arg in enumerate(args):
        raw = args[i + 1] if arg == flag and i + 1 < len(args) else (
            arg.split("=", 1)[1] if arg.startswith(flag + "=") else None)
        if raw is not None:
            try:
                value = max(1, int(raw))
            except ValueError:
                pass
    return value


class ReplicaBounds(Protocol):
    """How the autoscaler sizes a fleet, as far as the cost of speculation in replicas depends on it."""

    utilization: float
    min_replicas: int
    fixed_replicas: bool


@dataclass(frozen=True)
class Load:
    rps: float | None            # arrivals plus the autoscaler's headroom (requests/s)
    serving: int                 # pods that serve it (0: those the load needs)
    backlog: float | None = None  # requests that waited through the window (None: unknown)


def replicas_for(rps: float, per_replica: float) -> int:
    """Replicas that carry `rps` requests/s at `per_replica` each (at least one)."""
    return max(1, math.ceil(rps / per_replica - 1e-9))

def free_k(model: ServiceModel, policy: ReplicaBounds, rps: float, alpha: float, upto: int,
           serving: int = 0) -> int:
    """The deepest k <= `upto` at which speculating costs no replicas for `rps` requests/s (0: none), on
    `serving` replicas (0: those the load needs) - what the controller would keep; the planner starts
    there."""
    return affordable_k(model, policy, Load(rps, serving), alpha, upto)


def affordable_k(model: ServiceModel, policy: ReplicaBounds, load: Load | None, alpha: float, upto: int,
                 margin: float = 0.0) -> int:
    """The deepest k <= `upto` that costs no replicas at `load` (0: none)."""
    return next((k for k in range(upto, 0, -1) if not costs_replicas(model, policy, load, alpha, k, margin)), 0)


def carried(model: ServiceModel, load: Load) -> bool:
    """The fleet keeps up with `load` as it runs now, whatever the model prices: what stood in its queue
    through the window waits, at the rate it admits requests, under half the TTFT target (Little's law).
    Closed-loop clients send faster when answers come faster, so the load measured while speculating can
    exceed the model's capacity with no queue building."""
    if load.backlog is None or not load.rps:
        return False
    return load.backlog / load.rps < model.ttft_s / 2


def costs_replicas(model: ServiceModel, policy: ReplicaBounds, load: Load | None, alpha: float, k: int,
                   margin: float = 0.0) -> str:
    """Why speculating at depth k needs more replicas for the load than not speculating; "" when it
    needs none (or the load is unknown). The replicas it may use are those the load needs without it
    (at least `min_replicas`), and no more than serve now (while new ones start, the serving ones
    carry the load)."""
    if load is None or load.rps is None or load.rps <= 0 or k < 1:
        return ""
    on, off = model.replica_rps(policy.utilization, alpha, k), model.replica_rps(policy.utilization)
    keeps_up = carried(model, load)
    # Turning on a fleet whose queue stands wants it clear of a tie, else a recalibration flips it.
    if on >= off * (1 + (0.0 if keeps_up else margin)):
        return ""
    if policy.fixed_replicas and margin == 0 and keeps_up:
        return ""
    needed = max(math.ceil(load.rps / off - 1e-9), policy.min_replicas)
    if policy.fixed_replicas and load.serving > 0:
        needed = max(needed, load.serving)      # nothing scales down: the fleet there is is the fleet
    replicas = min(needed, load.serving) if load.serving > 0 else needed
    # Turning on (margin > 0) also wants the load clear of the point where one replica fewer would do
    # without speculation; else a load hovering there would switch it on and off as the count flips.
    shrinks = (margin > 0 and not policy.fixed_replicas and needed > policy.min_replicas
               and load.rps / (1 + margin) <= (needed - 1) * off)
    if load.rps * (1 + margin) <= replicas * on and not shrinks:
        return ""
    return (f"{load.rps:.1f} req/s on {replicas} replicas: with k={k} a replica carries {on:.1f} req/s instead of "
            f"{off:.1f} without speculation (draft tokens to verify take prompt budget); {needed} needed without")
