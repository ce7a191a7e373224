"""The simulated fleet (`SimulatedFleet`): pods that start, serve with continuous batching at the step
times of an engine profile (`truth.ProfileTruth`: measured, or derived and labelled so; never the
controller's roofline), and drain.

Time advances in ticks of `dt` seconds; inside a tick each pod runs steps of the profile's length at
its current batch (a mixed step while it prefills), times a draw of the profile's own step-to-step
spread (`ProfileTruth.step_sigma`, lognormal with mean 1, from a stream of its own so that arrivals
stay the same). While it speculates at depth k, k x `share` tokens
are drafted per sequence-step (n-gram drafting finds a match only for some, often shorter than k; the
share is the one at the pod's depth), so a step computes 1 + share x k tokens per sequence: its
sequences get dt / T(B, ctx, 1 + share x k) steps of 1 + share x (E[tokens | alpha, k] - 1) tokens each (alpha,
like the share, is one, or one per depth: the acceptance measured at the pod's depth), and prompts share what
the step's token budget leaves after the running sequences' tokens and draft tokens to verify. The inter-token
latencies the pods report are those of each sequence-step's tokens, as the engine times them: a step
that yields j tokens of a sequence gives each of them step / j, with j as many as the drafts accepted
plus one (`_token_classes`), so speculation's tail is one whole step while its mean is the step over
the tokens expected.
With a `contention.Contention`, each step is that much longer at the fleet's requests in flight (engines
and clients sharing the machine's cores, as `benchmarks/contention.py` measured them); without one, as the
profile says.
The gateway (as `cluster/gateway.py`) hands each request on arrival to the ready pod with the fewest
prompts waiting for prefill, then the fewest held (an endpoint picker that reads the engines' queue
depth); it holds requests only while no pod is ready. A request stays with its pod: a backlog built
before new pods are ready drains where it is, as it does behind a real gateway. Every pod keeps the
engine's cumulative metrics (vLLM names), and `scrape()` hands them to the control loop as `Scrape`s,
so the controller sees exactly what it would see from real engines.

At a pod, a prompt that has not started prefill waits (the engine's waiting queue): it holds no KV
cache and takes no part in the step, so step time and the prefill budget count started sequences only,
and a prompt starts only while fewer than `max_num_seqs` sequences run.

Queue policy, the engine scheduler's order for prompts that have not started prefill: `fifo` serves
them in arrival order; `deadline` first serves, in arrival order, those that can still meet their TTFT
deadline (arrival + TTFT target) if prefilled after the on-time prompts ahead of them at the pod's
prefill rate, then the late ones in arrival order. Prompts whose prefill has started keep going first
either way, and nothing is dropped.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from specfleet.operator.control import window as w
from specfleet.operator.capacity import ServiceModel
from specfleet.operator.cost import Share, expected_tokens, share_at, share_per_token
from specfleet.sim.contention import Contention
from specfleet.sim.truth import ProfileTruth

Alpha = float | Sequence[float]      # one acceptance, or the one measured at each depth 1, 2, ... (n-gram)

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0, math.inf)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
               0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, math.inf)
BATCH_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MAX_PODS = 4096
QUEUE_POLICIES = ("fifo", "deadline")
PROPOSAL_DEPTHS = 4     # the engine counts n-gram proposal lengths up to its counterfactual depth (at least)


@dataclass
class Totals:
    requests: int = 0
    met: int = 0
    good_tokens: float = 0.0
    tokens: float = 0.0
    tpot_sum: float = 0.0
    gpu_seconds: float = 0.0


@dataclass
class Record:
    """What the fleet did, tick by tick: (time, the token intervals of its busy pods (one per pod and
    number of tokens a sequence-step yielded), the tokens emitted at each), and finished requests:
    (time, TTFTs, mean time per output token, output tokens)."""
    intervals: list[tuple[float, np.ndarray, np.ndarray]] = field(default_factory=list)
    finished: list[tuple[float, np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)


class SimulatedFleet:
    """All pods of one service and the requests they serve."""

    def __init__(self, model: ServiceModel, truth: ProfileTruth, prompt: int, startup_s: float,
                 gpus_per_replica: int, kv_tokens: int, rng: np.random.Generator, queue_policy: str = "fifo",
                 output_sigma: float = 0.5, contention: Contention | None = None):
        if queue_policy not in QUEUE_POLICIES:
            raise ValueError(f"unknown queue policy {queue_policy!r}; one of {', '.join(QUEUE_POLICIES)}")
        self.m, self.truth, self.prompt, self.startup_s = model, truth, prompt, startup_s
        self.contention = contention       # slowdown by the clients in flight (None: the profile's own times)
        self.queue_policy, self.deadline = queue_policy, queue_policy == "deadline"
        self.kv_tokens, self.sigma = kv_tokens, output_sigma     # sigma: lognormal spread of output lengths
        self.gpus, self.rng = gpus_per_replica, rng
        self.step_sigma = truth.step_sigma
        self.noise = rng.spawn(1)[0] if self.step_sigma > 0 else None
        self.created = np.full(MAX_PODS, np.inf)
        self.ready_at = np.full(MAX_PODS, np.inf)
        self.removed = np.zeros(MAX_PODS, bool)
        self.draining = np.zeros(MAX_PODS, bool)
        self.k = np.zeros(MAX_PODS, int)
        self.n = 0
        self._now = 0.0
        self.cf_k = max(1, model.max_k)
        self.depths = max(PROPOSAL_DEPTHS, model.max_k)     # as the engine counts its proposal lengths
        self._shares: Share = 1.0
        self._alphas: Alpha = 0.0
        self._metrics()
        self.req = {key: np.zeros(0) for key in ("rep", "start", "arrival", "pleft", "oleft", "first", "worst", "olen",
                                                 "aligned")}
        self.queue_arrival, self.queue_out, self.queue_aligned = np.zeros(0), np.zeros(0), np.zeros(0)
        self.totals = Totals()
        self.ttft_samples: list[np.ndarray] = []
        self.record: Record | None = None       # per-tick detail for the trace replay (None: not kept)

    def _metrics(self) -> None:
        n = MAX_PODS
        self.ttft_h = np.zeros((n, len(TTFT_BUCKETS)))
        self.ttft_sum = np.zeros(n)
        self.itl_h = np.zeros((n, len(ITL_BUCKETS)))
        self.itl_sum = np.zeros(n)
        self.e2e_n, self.e2e_sum = np.zeros(n), np.zeros(n)
        self.batch_sum, self.batch_steps = np.zeros(n), np.zeros(n)
        self.step_s = np.zeros((n, len(BATCH_BOUNDS) + 1, 2))
        self.step_n = np.zeros((n, len(BATCH_BOUNDS) + 1, 2))
        self.step_seqs = np.zeros((n, len(BATCH_BOUNDS) + 1, 2))
        self.step_tokens = np.zeros((n, len(BATCH_BOUNDS) + 1, 2))
        self.c = {name: np.zeros(n) for name in (w.PROMPT_TOKENS, w.GENERATION_TOKENS, w.DRAFTS, w.DRAFT_TOKENS,
                                                 w.ACCEPTED_TOKENS, w.CF_DRAFT_TOKENS, w.CF_ACCEPTED_TOKENS,
                                                 w.SPEC_SEQ_STEPS, w.CF_SEQ_STEPS, w.PROPOSAL_SEQ_STEPS,
                                                 *(w.proposed_key(j) for j in range(1, self.depths + 1)))}

    # -- pods ------------------------------------------------------------------------------------
    def add_pods(self, count: int, now: float, k: int, ready_now: bool = False) -> None:
        for _ in range(count):
            i = self.n
            self.n += 1
            self.created[i], self.ready_at[i], self.k[i] = now, now if ready_now else now + self.startup_s, k

    def alive(self) -> np.ndarray:
        return np.flatnonzero(~self.removed[:self.n] & ~self.draining[:self.n])

    def ready(self, now: float) -> np.ndarray:
        ids = np.flatnonzero(~self.removed[:self.n])
        return ids[self.ready_at[ids] <= now]

    def remove_pods(self, count: int, now: float) -> None:
        """Cancel starting pods first, then drain the least-loaded ready ones."""
        ids = self.alive()
        batch = np.bincount(self.req["rep"].astype(int), minlength=self.n)[:self.n]
        order = sorted(ids, key=lambda i: (self.ready_at[i] <= now, batch[i], -i))
        for i in order[:count]:
            if self.ready_at[i] > now:
                self.removed[i] = True
            else:
                self.draining[i] = True

    def set_speculation(self, enabled: bool, k: int) -> None:
        self.k[:self.n] = k if enabled else 0
        self.cf_k = max(1, k)

    # -- time ------------------------------------------------------------------------------------
    def tick(self, t0: float, dt: float, rate: float, alpha: Alpha, share: Share = 1.0) -> None:
        """Advance `dt` seconds: arrivals at `rate`/s, acceptance `alpha` and a draft `share` of the decoding
        sequence-steps' tokens drafted, each one or one per depth 1, 2, ..., at each pod's depth."""
        self._now = t0 + dt
        self._shares, self._alphas = share, alpha
        self._arrive(t0, dt, rate)
        self._admit(t0)
        k = self.k[:self.n]
        self._advance(t0, dt, _alpha_by_pod(alpha, k), _share_by_pod(share, k))
        live = ~self.removed[:self.n] & (self.created[:self.n] <= t0)
        self.totals.gpu_seconds += dt * self.gpus * int(live.sum())
        empty = self.draining[:self.n] & (np.bincount(self.req["rep"].astype(int), minlength=self.n)[:self.n] == 0)
        self.removed[:self.n] |= empty

    def _arrive(self, t0: float, dt: float, rate: float) -> None:
        count = self.rng.poisson(max(rate, 0.0) * dt)
        if count:
            arrivals = np.sort(self.rng.uniform(t0, t0 + dt, count))
            mean = self.m.output_tokens
            out = np.clip(self.rng.lognormal(math.log(mean) - self.sigma ** 2 / 2, self.sigma, count), 16, 4 * mean).round()
            self._queue(arrivals, out, np.zeros(count))

    def submit(self, arrivals: np.ndarray, outputs: np.ndarray, aligned: bool | np.ndarray = False) -> None:
        """Requests that arrive at the gateway at `arrivals` with `outputs` tokens each (closed-loop clients).
        `aligned`: sent as the client's last request ended, which is at the end of a step: such a request
        reaches its pod as the next step starts and waits out all of it, where one arriving at a random
        time waits out a uniform share of the step in progress. The client's round trip is left out: on
        this project's CPU runs the clients saw a first token 5-13 ms after the engine in most phases, against
        steps of 35-160 ms (benchmarks/results/contention_xeon_ttft.json)."""
        arrivals = np.asarray(arrivals, float)
        self._queue(arrivals, np.asarray(outputs, float), np.broadcast_to(np.asarray(aligned, float), arrivals.shape))

    def _queue(self, arrivals: np.ndarray, outputs: np.ndarray, aligned: np.ndarray) -> None:
        self.queue_arrival = np.concatenate([self.queue_arrival, arrivals])
        self.queue_out = np.concatenate([self.queue_out, outputs])
        self.queue_aligned = np.concatenate([self.queue_aligned, aligned])

    def in_flight(self) -> int:
        """Requests not finished: at the gateway and at the pods."""
        return len(self.queue_arrival) + len(self.req["rep"])

    def _admit(self, t0: float) -> None:
        """Hand every request at the gateway to a ready pod (none wait there while one is ready)."""
        ids = self.ready(t0)
        ids = ids[~self.draining[ids]]
        m = len(self.queue_arrival)
        if not len(ids) or not m:
            return
        held, running = self._batches()
        rep = ids[_deal((held - running)[ids].astype(int), held[ids].astype(int), m)]
        arrival, out, aligned = self.queue_arrival, self.queue_out, self.queue_aligned
        self.queue_arrival, self.queue_out, self.queue_aligned = np.zeros(0), np.zeros(0), np.zeros(0)
        new = {"rep": rep.astype(float), "start": np.maximum(arrival, t0), "arrival": arrival,
               "pleft": np.full(m, float(self.prompt)), "oleft": out, "first": np.full(m, np.nan),
               "worst": np.zeros(m), "olen": out, "aligned": aligned}
        self.req = {key: np.concatenate([self.req[key], new[key]]) for key in self.req}
        np.add.at(self.c[w.PROMPT_TOKENS], rep, self.prompt)

    def _prefill_order(self, r, rep: np.ndarray, idx: np.ndarray, t0: float, rate: np.ndarray) -> np.ndarray:
        """Pending prompts per pod in service order: admission order (fifo), or started prefills, then
        prompts that can still meet their deadline at the pod's prefill `rate` (tokens/s), then late
        ones, each in arrival order (deadline)."""
        if not self.deadline:
            return idx[np.lexsort((r["start"][idx], rep[idx]))]
        started = r["pleft"][idx] < self.prompt
        ahead = np.bincount(rep[idx][started], weights=r["pleft"][idx][started], minlength=self.n)
        waiting = idx[~started]
        waiting = waiting[np.lexsort((r["arrival"][waiting], rep[waiting]))]
        pods = rep[waiting]
        deadline = r["arrival"][waiting] + self.m.ttft_s
        # Fast check: every waiting prompt fits behind all those before it at its pod (none is late).
        first = np.r_[0, np.flatnonzero(np.diff(pods)) + 1]
        position = np.arange(len(waiting)) - np.repeat(first, np.diff(np.r_[first, len(waiting)]))
        fits = ((deadline - t0) * rate[pods] - ahead[pods]) / self.prompt >= position + 1
        late = np.zeros(len(waiting), bool)
        for pod in np.unique(pods[~fits]):
            mine = np.flatnonzero(pods == pod)
            late[mine] = _late(deadline[mine], t0, float(ahead[pod]), float(rate[pod]), self.prompt)
        rank = np.zeros(len(r["rep"]), int)
        rank[waiting] = np.where(late, 2, 1)
        return idx[np.lexsort((r["arrival"][idx], rank[idx], rep[idx]))]

    def _within_slots(self, r, rep: np.ndarray, order: np.ndarray, running: np.ndarray) -> np.ndarray:
        """`order` (grouped by pod) less the waiting prompts that find no free sequence slot: a prompt
        starts only while fewer than `max_num_seqs` sequences run at its pod."""
        fresh = r["pleft"][order] >= self.prompt
        if not fresh.any():
            return order
        pods = rep[order]
        starts = np.r_[0, np.flatnonzero(np.diff(pods)) + 1]
        cum = np.cumsum(fresh)
        rank = cum - np.repeat(np.r_[0, cum][starts], np.diff(np.r_[starts, len(order)]))
        free = np.maximum(self.m.max_num_seqs - running, 0)
        return order[~fresh | (rank <= free[pods])]

    def _batches(self) -> tuple[np.ndarray, np.ndarray]:
        """Requests each pod holds, and those of them in the step (prefill started; the rest wait)."""
        r = self.req
        rep = r["rep"].astype(int)
        held = np.bincount(rep, minlength=self.n).astype(float)
        active = np.bincount(rep, weights=(r["pleft"] < self.prompt).astype(float), minlength=self.n)
        return held, active

    def _advance(self, t0: float, dt: float, alpha: float | np.ndarray, share: float | np.ndarray = 1.0) -> None:
        r, t1 = self.req, t0 + dt
        if not len(r["rep"]):
            return
        rep = r["rep"].astype(int)
        held, batch = self._batches()
        prefilling = np.bincount(rep, weights=(r["pleft"] > 0).astype(float), minlength=self.n) > 0
        pending = np.bincount(rep, weights=np.maximum(r["pleft"], 0.0), minlength=self.n)
        k = self.k[:self.n]
        share = np.broadcast_to(np.asarray(share, float), k.shape)
        alpha = np.broadcast_to(np.asarray(alpha, float), k.shape)
        step = self._step_time(batch, k, prefilling, share, pending)
        plain = self._step_time(batch, k, np.zeros_like(prefilling), share) if prefilling.any() else step
        if self.noise is not None:
            sigma = self.step_sigma
            drawn = self.noise.lognormal(-sigma * sigma / 2, sigma, len(step))
            step, plain = step * drawn, plain * drawn
        steps = np.where(held > 0, dt / step, 0.0)
        tokens_per_step = _expected(alpha, k, share)
        tpot = step / tokens_per_step
        first_at = self._prefill(r, rep, batch, steps, t0, dt, share, step, plain)
        decode_from = np.where(np.isnan(r["first"]), t1, np.maximum(r["first"], np.maximum(r["start"], t0)))
        toks = np.maximum(t1 - decode_from, 0.0) / tpot[rep]
        toks = np.minimum(toks, np.maximum(r["oleft"], 0))
        r["oleft"] -= toks
        r["worst"] = np.where(toks > 0, np.maximum(r["worst"], tpot[rep]), r["worst"])
        self._observe(rep, batch, steps, step, tpot, tokens_per_step, k, alpha, share, toks, first_at)
        computed = np.maximum(batch * (1 + share * k), np.where(prefilling, self.m.chunk, 0))
        pods = np.flatnonzero(batch > 0)
        bucket, spec = np.searchsorted(BATCH_BOUNDS, batch[pods]), (k[pods] > 0).astype(int)
        self.step_tokens[pods, bucket, spec] += steps[pods] * computed[pods]
        self._finish(r)

    def _prefill(self, r, rep, batch, steps, t0, dt, share: float | np.ndarray = 1.0,
                 step: np.ndarray | None = None, plain: np.ndarray | None = None) -> np.ndarray:
        """Serve prompt tokens from each pod's per-step budget, oldest first; returns new first-token times.
        Steps are discrete: a request that reaches a pod waits out the step running there (a uniform
        share of it; all of it for one `aligned` to a step's end), a step without its prompt (`plain`, each
        pod's; `step` where not given), and gets its first token at the end of a step of its own, which
        prefills (`step`): no first token comes sooner than that after the request's start."""
        idx = np.flatnonzero(r["pleft"] > 0)
        first_at = np.full(len(rep), np.nan)
        if not len(idx):
            return first_at
        budget = steps * self._room(batch, self.k[:self.n], share)
        order = self._within_slots(r, rep, self._prefill_order(r, rep, idx, t0, budget / dt), batch)
        if not len(order):
            return first_at
        pods = rep[order]
        left = r["pleft"][order]
        cum = np.cumsum(left)
        starts = np.r_[0, np.flatnonzero(np.diff(pods)) + 1]
        within = cum - np.repeat(cum[starts] - left[starts], np.diff(np.r_[starts, len(order)]))
        r["pleft"][order] = left - np.clip(budget[pods] - (within - left), 0, left)
        finished = r["pleft"][order] <= 1e-9
        done = order[finished]
        frac = np.clip(within[finished] / np.maximum(budget[pods[finished]], 1e-9), 0, 1)
        earliest = r["start"][done]
        if step is not None:
            aligned = r["aligned"][done] > 0
            wait = np.ones(len(done))
            wait[~aligned] = self.rng.uniform(0.0, 1.0, int((~aligned).sum()))
            running = (step if plain is None else plain)[pods[finished]]
            earliest = earliest + running * wait + step[pods[finished]]
        r["first"][done] = np.maximum(t0 + frac * dt, earliest)
        r["oleft"][done] -= 1
        first_at[done] = r["first"][done]
        return first_at

    def _room(self, batch: np.ndarray, k: np.ndarray, share: float | np.ndarray = 1.0) -> np.ndarray:
        """Prompt tokens per step: the budget the running sequences leave, each taking its token plus, a
        `share` of them, k draft tokens to verify (the engine schedules them before waiting prompts)."""
        return np.maximum(self.m.chunk - batch * (1 + share * k), 1.0)

    def _step_time(self, batch: np.ndarray, k: np.ndarray, prefilling: np.ndarray,
                   share: float | np.ndarray = 1.0, pending: np.ndarray | None = None) -> np.ndarray:
        step = self.truth.step(batch, k, prefilling, share, pending)
        if self.contention is None:
            return step
        return step * self.contention.factor(self.in_flight(), k > 0)

    def _observe(self, rep, batch, steps, step, tpot, tokens_per_step, k, alpha, share, toks, first_at) -> None:
        pods = np.flatnonzero(batch > 0)
        per_pod = np.bincount(rep, weights=toks, minlength=self.n)
        together, weights = _token_classes(alpha[pods], k[pods], share[pods])
        itl = step[pods, None] / together                  # [pod, class]: each token's interval
        tokens = per_pod[pods, None] * weights
        np.add.at(self.itl_h, (np.repeat(pods, len(together)), np.searchsorted(ITL_BUCKETS, itl.ravel())),
                  tokens.ravel())
        self.itl_sum[pods] += per_pod[pods] * tpot[pods]          # = the sum of tokens x itl over the classes
        self.c[w.GENERATION_TOKENS][:self.n] += per_pod + np.bincount(rep[~np.isnan(first_at)], minlength=self.n)
        got = np.flatnonzero(~np.isnan(first_at))
        if len(got):
            ttft = first_at[got] - self.req["arrival"][got]
            np.add.at(self.ttft_h, (rep[got], np.searchsorted(TTFT_BUCKETS, ttft)), 1)
            np.add.at(self.ttft_sum, rep[got], ttft)
        if self.record is not None:
            self.record.intervals.append((self._now, itl.ravel(), tokens.ravel()))
        self.batch_sum[pods] += batch[pods] * steps[pods]
        self.batch_steps[pods] += steps[pods]
        bucket = np.searchsorted(BATCH_BOUNDS, batch[pods])
        spec = (k[pods] > 0).astype(int)
        self.step_s[pods, bucket, spec] += steps[pods] * step[pods]
        self.step_n[pods, bucket, spec] += steps[pods]
        self.step_seqs[pods, bucket, spec] += steps[pods] * batch[pods]
        self._count_drafts(pods, steps[pods] * batch[pods], tokens_per_step[pods], k[pods], share[pods])

    def _count_drafts(self, pods, seq_steps, tokens_per_step, k, share: np.ndarray) -> None:
        """The engine's speculation counters for `seq_steps` decoding sequence-steps per pod: while on,
        k x `share` tokens drafted per sequence-step (tokens_per_step - 1 accepted on average); while
        off, the n-gram guesses scored at the counterfactual depth; on or off, the fresh proposals'
        tokens at every depth: the tick's share at that depth per step while on, and while off per token
        (`cost.share_per_token`: an engine that is not speculating proposes after every token). Each depth's
        guesses are accepted at the tick's acceptance at that depth."""
        on, off = pods[k > 0], pods[k <= 0]
        on_steps, off_steps = seq_steps[k > 0], seq_steps[k <= 0]
        self.c[w.SPEC_SEQ_STEPS][on] += on_steps
        self.c[w.DRAFTS][on] += on_steps * share[k > 0]
        self.c[w.DRAFT_TOKENS][on] += on_steps * share[k > 0] * k[k > 0]
        self.c[w.ACCEPTED_TOKENS][on] += on_steps * (tokens_per_step[k > 0] - 1)
        cf_share = share_at(self._shares, self.cf_k)
        self.c[w.CF_SEQ_STEPS][off] += off_steps
        self.c[w.CF_DRAFT_TOKENS][off] += off_steps * cf_share * self.cf_k
        cf_alpha = alpha_at(self._alphas, self.cf_k)
        self.c[w.CF_ACCEPTED_TOKENS][off] += off_steps * (expected_tokens(cf_alpha, self.cf_k, cf_share) - 1)
        self.c[w.PROPOSAL_SEQ_STEPS][pods] += seq_steps
        for depth in range(1, self.depths + 1):
            per_step = share_at(self._shares, depth)          # the profile measured it speculating
            self.c[w.proposed_key(depth)][on] += on_steps * depth * per_step
            self.c[w.proposed_key(depth)][off] += off_steps * depth * share_per_token(
                per_step, alpha_at(self._alphas, depth), depth)

    def _finish(self, r) -> None:
        done = (r["oleft"] <= 1e-9) & ~np.isnan(r["first"])
        if not done.any():
            return
        ttft = r["first"][done] - r["arrival"][done]
        met = (ttft <= self.m.ttft_s) & (r["worst"][done] <= self.m.itl_s)
        pods = r["rep"][done].astype(int)
        np.add.at(self.e2e_n, pods, 1)
        np.add.at(self.e2e_sum, pods, self._now - r["arrival"][done])
        t = self.totals
        t.requests += int(done.sum())
        t.met += int(met.sum())
        t.good_tokens += float(r["olen"][done][met].sum())
        t.tokens += float(r["olen"][done].sum())
        t.tpot_sum += float(r["worst"][done].sum())
        self.ttft_samples.append(ttft.astype(np.float32))
        if self.record is not None:
            decode = np.maximum(self._now - r["first"][done], 0.0) / np.maximum(r["olen"][done] - 1, 1)
            self.record.finished.append((self._now, ttft, decode, r["olen"][done]))
        self.req = {key: value[~done] for key, value in r.items()}

    def unfinished_late(self, now: float) -> int:
        """Requests not finished at `now` that already missed the TTFT target (queued or at a pod), so a
        run's end cannot hide requests a queue policy left waiting."""
        r, limit = self.req, self.m.ttft_s
        waited = np.where(np.isnan(r["first"]), now, r["first"]) - r["arrival"]
        return int(np.sum(now - self.queue_arrival > limit) + np.sum(waited > limit))

    # -- what the control loop sees ------------------------------------------------------------
    def queue_depth(self) -> int:
        """Requests not yet in prefill: at the gateway and in the pods' waiting queues."""
        waiting = int(np.sum(self.req["pleft"] >= self.prompt)) if len(self.req["pleft"]) else 0
        return len(self.queue_arrival) + waiting

    def scrape(self, now: float) -> dict[str, w.Scrape]:
        ids = self.ready(now)
        held, running = self._batches()
        waiting = held - running
        open_ids = ids[~self.draining[ids]]
        held_back = len(self.queue_arrival) / max(len(open_ids), 1)    # at the gateway: no pod was ready
        return {f"pod-{i}": self._scrape_pod(i, now, running[i], waiting[i] + (held_back if i in open_ids else 0.0))
                for i in ids}

    def _scrape_pod(self, i: int, now: float, running: float, waiting: float) -> w.Scrape:
        hists = {w.TTFT: _hist(TTFT_BUCKETS, self.ttft_h[i], self.ttft_sum[i]),
                 w.ITL: _hist(ITL_BUCKETS, self.itl_h[i], self.itl_sum[i]),
                 w.BATCH_SIZE: w.Histogram((math.inf,), (self.batch_steps[i],), self.batch_sum[i]),
                 w.E2E: w.Histogram((math.inf,), (self.e2e_n[i],), self.e2e_sum[i])}
        counters = {name: float(v[i]) for name, v in self.c.items()}
        counters[w.ENDED + "{finished_reason=stop}"] = float(self.e2e_n[i])
        for b, bound in enumerate((*BATCH_BOUNDS, "256+")):
            for s, flag in enumerate(("false", "true")):
                if self.step_n[i, b, s] > 0:
                    label = f"{{batch_size_bucket={bound},speculating={flag}}}"
                    hists[w.STEP_TIME + label] = w.Histogram((math.inf,), (self.step_n[i, b, s],), self.step_s[i, b, s])
                    counters[w.STEP_SEQS + label] = float(self.step_seqs[i, b, s])
                    counters[w.STEP_TOKENS + label] = float(self.step_tokens[i, b, s])
        kv = running * self.m.ctx / max(self.kv_tokens, 1)
        gauges = {w.RUNNING: float(running), w.WAITING: float(waiting), w.KV_USAGE: float(min(kv, 1.0)),
                  w.SPEC_ENABLED: float(self.k[i] > 0), w.SPEC_K: float(self.k[i] or self.cf_k)}
        return w.Scrape(now, counters, gauges, hists)


def _hist(bounds, counts, total) -> w.Histogram:
    return w.Histogram(tuple(bounds), tuple(np.cumsum(counts).tolist()), float(total))


def _share_by_pod(share: Share, k: np.ndarray) -> np.ndarray:
    """Each pod's draft share at its depth (off pods: the share at depth 1, unused)."""
    return np.array([share_at(share, max(1, int(depth))) for depth in k], float)


def alpha_at(alpha: Alpha, k: int) -> float:
    """The acceptance at depth `k`: one for every depth, or the one measured at `k` (past the deepest
    measured, the deepest's; off, depth 1's)."""
    if isinstance(alpha, (int, float)):
        return float(alpha)
    return float(alpha[min(max(k, 1), len(alpha)) - 1])


def _alpha_by_pod(alpha: Alpha, k: np.ndarray) -> np.ndarray:
    return np.array([alpha_at(alpha, int(depth)) for depth in k], float)


def _expected(alpha: float | np.ndarray, k: np.ndarray, share: float | np.ndarray = 1.0) -> np.ndarray:
    """Tokens per sequence-step at depth `k` (vectorized `cost.expected_tokens`): a `share` drafts; `alpha`
    one, or one per pod."""
    alpha = np.broadcast_to(np.asarray(alpha, float), np.shape(k))
    below = np.minimum(alpha, 1 - 1e-12)
    full = np.where(alpha >= 1, k + 1.0, (1 - below ** (k + 1)) / (1 - below))
    return share * full + (1 - share)          # = 1 + share x (full - 1), and exactly `full` at share 1


def _token_classes(alpha: float | np.ndarray, k: np.ndarray, share: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(j, weights): j = 1 .. max(k) + 1 tokens of one sequence come out of one step together, and
    weights[pod, j - 1] is the share of the pod's tokens that came j at a time. A `share` of the
    sequence-steps draft k tokens, of which a are accepted with probability alpha^a (1 - alpha) below k
    and alpha^k at k (j = a + 1); the others decode one token. Sums to 1 per pod, and its mean over
    tokens of 1 / j is 1 / `_expected`."""
    together = np.arange(1, int(k.max(initial=0)) + 2, dtype=float)
    accepted, depth = together[None, :] - 1, np.asarray(k, float)[:, None]
    alpha = np.broadcast_to(np.asarray(alpha, float), np.shape(k))[:, None]
    p = np.where(accepted < depth, alpha ** accepted * (1 - alpha), np.where(accepted == depth, alpha ** depth, 0.0))
    p = np.asarray(share, float)[:, None] * p
    p[:, 0] += 1 - np.asarray(share, float)
    tokens = p * together
    return together, tokens / tokens.sum(axis=1, keepdims=True)


def _late(deadlines: np.ndarray, now: float, ahead: float, rate: float, prompt: float) -> np.ndarray:
    """Which waiting prompts (deadlines ascending) miss their deadline even when served in order after
    `ahead` tokens and the on-time prompts before them at `rate` tokens/s (the late ones step aside)."""
    late = np.ones(len(deadlines), bool)
    if rate <= 0:
        return late
    # Whole prompts that fit before each deadline; a prompt is on time while that exceeds those ahead.
    fits = np.floor(((deadlines - now) * rate - ahead) / prompt)
    on_time = 0
    for i in np.flatnonzero(fits >= 1):
        if fits[i] > on_time:
            on_time += 1
            late[i] = False
    return late


def _deal(waiting: np.ndarray, held: np.ndarray, m: int) -> np.ndarray:
    """Pod positions for `m` requests, one at a time, each to the pod with the fewest prompts waiting
    for prefill, then the fewest requests held (an endpoint picker reading the engines' queue depth).
    A pod that just became ready takes requests only as fast as it starts their prefill instead of all
    arrivals until it holds as many as the others."""
    key = [(int(q), int(h), i) for i, (q, h) in enumerate(zip(waiting, held))]
    heapq.heapify(key)
    out = []
    while len(out) < m:
        q, h, i = heapq.heappop(key)
        out.append(i)
        heapq.heappush(key, (q + 1, h + 1, i))
    return np.array(out, dtype=int)
