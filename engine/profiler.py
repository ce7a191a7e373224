"""Measure an engine's cost profile: step time T(batch, context, q) on the real model runner.

Decode (q = 1) and verification (q = k + 1) points time whole `LLMEngine.step` calls on `batch` real
sequences at `context` tokens, after warm-up, as the median of repeats: the forward pass and the host
work around it (n-gram search, scheduling, sampling or verification, advancing the sequences), which
on a small model is a large share of a speculative step. The sequences share a prompt prefix (prefix
caching makes their prefill cheap) and differ in their last block. While verifying, every sequence
drafts k tokens (the n-gram proposal, padded), so a point is the cost of a fully drafted step; the
share of sequences that find a draft on real text is measured with the acceptance.

Prefill points lay out a synthetic chunk (`context` cached tokens, `chunk` computed) and time
`ModelRunner.execute` over the paged KV cache on a block table of its own. n-gram acceptance and the
draft share come from generating on a prompt set with speculation on and reading the engine's counters.
"""
from __future__ import annotations

import logging
import statistics
import subprocess
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import torch

from specfleet.engine.config import EngineConfig
from specfleet.engine.engine import LLMEngine
from specfleet.engine.host import host_info
from specfleet.engine.profile_model import Acceptance, Profile, StepPoint, fit_profile
from specfleet.engine.sampling_params import SamplingParams
from specfleet.engine.scheduler import SchedulerOutput
from specfleet.engine.sequence import Sequence

log = logging.getLogger(__name__)
BLOCK_SIZE = 16

BUILTIN_PROMPTS = {
    "copy-heavy": [
        "Repeat this list exactly: alpha beta gamma delta epsilon alpha beta gamma delta epsilon alpha beta",
        "Copy the code: def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n",
        "Say it again: the quick brown fox jumps over the lazy dog, the quick brown fox jumps over the lazy dog",
    ],
    "open-ended": [
        "Write a short story about a lighthouse keeper.",
        "Why do operators reconcile resources in a loop?",
        "Describe your ideal weekend.",
    ],
}


@dataclass(frozen=True)
class ProfileSpec:
    model: str
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    max_k: int
    chunks: tuple[int, ...]
    warmup: int = 2
    repeats: int = 5
    passes: int = 1          # sweeps over the grid; a point is the median of its sweeps (drift spreads out)
    prompts: dict[str, list[str]] | None = None     # None: BUILTIN_PROMPTS
    max_tokens: int = 64
    device: str = "auto"
    dtype: str = "auto"
    threads: int | None = None        # torch CPU threads; None: torch's default

    def __post_init__(self) -> None:
        for name in ("batches", "contexts", "chunks"):
            values = getattr(self, name)
            if not values or any(v < 1 for v in values):
                raise ValueError(f"{name} must be a non-empty list of positive integers, got {list(values)}")
        if self.max_k < 1:
            raise ValueError(f"max_k must be >= 1, got {self.max_k}")
        if self.repeats < 1 or self.warmup < 0 or self.passes < 1:
            raise ValueError("repeats and passes must be >= 1 and warmup >= 0")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")


def powers_of_two(limit: int) -> tuple[int, ...]:
    if limit < 1:
        raise ValueError(f"max batch must be >= 1, got {limit}")
    return tuple(2 ** i for i in range(limit.bit_length()) if 2 ** i <= limit)


def grid(spec: ProfileSpec) -> list[tuple[str, int, int, int]]:
    """(kind, batch, context, q) of every point to measure."""
    steps = [("decode", b, c, 1) for b in spec.batches for c in spec.contexts]
    steps += [("verify", b, c, k + 1) for k in range(1, spec.max_k + 1) for b in spec.batches for c in spec.contexts]
    steps += [("prefill", 1, c, n) for n in spec.chunks for c in spec.contexts]
    return steps


def _longest(spec: ProfileSpec) -> int:
    """Positions the largest step reaches: its context plus the tokens it computes."""
    return max(spec.contexts) + max(max(spec.chunks), spec.max_k + 1)


def _blocks_needed(spec: ProfileSpec, block_size: int) -> int:
    return -(-_longest(spec) // block_size)


def _synthetic_step(batch: int, context: int, q: int, table: list[int], vocab: int) -> SchedulerOutput:
    out = SchedulerOutput()
    gen = torch.Generator().manual_seed(context * 31 + q)
    for i in range(batch):
        tokens = torch.randint(3, vocab, (context + 1,), generator=gen).tolist()
        seq = Sequence(f"profile-{i}", tokens, len(tokens), SamplingParams(), block_table=table)
        seq.num_computed_tokens = context              # KV already in the cache; q tokens computed now
        seq.spec_token_ids = torch.randint(3, vocab, (q - 1,), generator=gen).tolist()
        out.add(seq, q)
    return out


def _prefill_step(context: int, chunk: int, table: list[int], vocab: int) -> SchedulerOutput:
    gen = torch.Generator().manual_seed(context * 17 + chunk)
    tokens = torch.randint(3, vocab, (context + chunk,), generator=gen).tolist()
    seq = Sequence("profile-prefill", tokens, len(tokens), SamplingParams(), block_table=table)
    seq.num_computed_tokens = context
    out = SchedulerOutput()
    out.add(seq, chunk)
    return out


def _sync(engine: LLMEngine) -> Callable[[], None]:
    return torch.cuda.synchronize if engine.device.type == "cuda" else (lambda: None)


def time_step(engine: LLMEngine, step: SchedulerOutput, warmup: int, repeats: int) -> list[float]:
    sync = _sync(engine)
    for _ in range(warmup):
        engine.runner.execute(step)
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        engine.runner.execute(step)
        sync()
        times.append(time.perf_counter() - start)
    return times


def measure_prefill(engine: LLMEngine, spec: ProfileSpec, context: int, chunk: int, table: list[int]) -> StepPoint:
    times = time_step(engine, _prefill_step(context, chunk, table, engine.vocab_size), spec.warmup, spec.repeats)
    return StepPoint("prefill", 1, context, chunk, statistics.median(times), max(times) - min(times), len(times))


class PaddedDrafts:
    """The engine's n-gram proposer, its proposal padded to k tokens: every sequence verifies k drafts."""

    def __init__(self, ngram) -> None:
        self.ngram = ngram

    def propose(self, token_ids: list[int], k: int) -> list[int]:
        found = self.ngram.propose(token_ids, k)
        return found + [token_ids[-1]] * (k - len(found))


def _prompts(batch: int, context: int, block_size: int, vocab: int) -> list[list[int]]:
    """`batch` prompts of `context` tokens sharing all but their last block."""
    gen = torch.Generator().manual_seed(context)
    tail = min(block_size, context)
    shared = torch.randint(3, vocab, (context - tail,), generator=gen).tolist()
    return [shared + torch.randint(3, vocab, (tail,), generator=gen).tolist() for _ in range(batch)]


def _run_until_decoding(engine: LLMEngine) -> None:
    while engine.scheduler.waiting or any(s.num_output_tokens == 0 for s in engine.scheduler.running):
        engine.step()


def measure_engine_step(engine: LLMEngine, spec: ProfileSpec, batch: int, context: int, q: int) -> StepPoint:
    """Whole engine steps of `batch` decoding sequences at `context`, verifying q - 1 drafts each (q > 1)."""
    k = q - 1
    engine.set_speculation(enabled=False)
    params = SamplingParams(temperature=0.0, max_tokens=(spec.warmup + spec.repeats + 2) * q + 2, ignore_eos=True)
    ids = [f"profile-{batch}-{context}-{q}-{i}" for i in range(batch)]
    prompts = _prompts(batch, context, engine.config.block_size, engine.vocab_size)
    engine.add_request(ids[0], prompts[0], params)        # computes the shared prefix once, for the others to hit
    _run_until_decoding(engine)
    for request_id, prompt in zip(ids[1:], prompts[1:]):
        engine.add_request(request_id, prompt, params)
    _run_until_decoding(engine)
    if k:
        engine.set_speculation(enabled=True, num_speculative_tokens=k)
    tokens: list[int] = []
    engine.step_listeners.append(lambda record: tokens.append(record.num_tokens))
    ngram = engine.speculator.ngram
    if k:
        engine.speculator.ngram = PaddedDrafts(ngram)
    try:
        times = _time_engine_steps(engine, spec.warmup, spec.repeats)
    finally:
        engine.speculator.ngram = ngram
        engine.step_listeners.pop()
        for request_id in ids:
            engine.abort(request_id)
    timed = tokens[spec.warmup:]
    return StepPoint("verify" if k else "decode", batch, context, q, statistics.median(times),
                     max(times) - min(times), len(times), tokens=statistics.mean(timed))


def _time_engine_steps(engine: LLMEngine, warmup: int, repeats: int) -> list[float]:
    sync = _sync(engine)
    for _ in range(warmup):
        engine.step()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        engine.step()
        sync()
        times.append(time.perf_counter() - start)
    return times


def measure_point(engine: LLMEngine, spec: ProfileSpec, kind: str, batch: int, context: int, q: int,
                  table: list[int]) -> StepPoint:
    if kind == "prefill":
        return measure_prefill(engine, spec, context, q, table)
    return measure_engine_step(engine, spec, batch, context, q)


def merge_passes(same: list[StepPoint]) -> StepPoint:
    """One grid point measured in several passes: the median of the passes' medians; the spread covers
    the passes' spreads and their drift."""
    if len(same) == 1:
        return same[0]
    medians = [p.median_s for p in same]
    low = min(p.median_s - p.spread_s / 2 for p in same)
    high = max(p.median_s + p.spread_s / 2 for p in same)
    tokens = [p.tokens for p in same if p.tokens is not None]
    return replace(same[0], median_s=statistics.median(medians), spread_s=high - low,
                   repeats=sum(p.repeats for p in same), tokens=statistics.mean(tokens) if tokens else None)


def measure_acceptance(engine: LLMEngine, prompts: dict[str, list[str] | list[list[int]]], max_k: int,
                       max_tokens: int, on_progress: Callable[[str], None] = lambda what: None) -> list[Acceptance]:
    """Accepted / drafted tokens per workload and depth, and the draft share: drafts per decoding
    sequence-step (the share of sequences whose n-gram search found something to verify)."""
    results = []
    decoding: list[int] = []
    engine.step_listeners.append(lambda record: decoding.append(record.num_decode_seqs))
    try:
        for k in range(1, max_k + 1):
            engine.set_speculation(enabled=True, num_speculative_tokens=k)
            for workload, texts in prompts.items():
                s = engine.stats
                drafts, drafted, accepted, seq_steps = s.spec_drafts, s.spec_draft_tokens, s.spec_accepted_tokens, \
                    sum(decoding)
                _generate(engine, texts, max_tokens, f"{workload}-k{k}")
                results.append(Acceptance(workload, k, s.spec_draft_tokens - drafted, s.spec_accepted_tokens - accepted,
                                          drafts=s.spec_drafts - drafts, decode_seq_steps=sum(decoding) - seq_steps))
                on_progress(f"n-gram acceptance {workload} k={k}")
    finally:
        engine.step_listeners.pop()
    return results


def _generate(engine: LLMEngine, prompts: list, max_tokens: int, tag: str) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"{tag}-{i}", prompt, params)
    while engine.has_unfinished():
        engine.step()


def build_engine(spec: ProfileSpec) -> LLMEngine:
    if spec.threads:
        torch.set_num_threads(spec.threads)
    # Room for the prefill points' block table, the largest batch of real sequences, and the acceptance runs.
    per_sequence = _blocks_needed(spec, BLOCK_SIZE) + 1
    num_blocks = max(per_sequence * (max(spec.batches) + 1), 512)
    config = EngineConfig(model=spec.model, block_size=BLOCK_SIZE, num_kv_blocks=num_blocks, device=spec.device,
                          dtype=spec.dtype, speculative_method="ngram", num_speculative_tokens=spec.max_k,
                          max_num_seqs=max(max(spec.batches), 1), enable_prefix_caching=True)
    engine = LLMEngine(config)
    engine.detokenize_every_step = True      # as the server runs it: text streams with every step
    longest = _longest(spec)
    if longest > engine.max_model_len:
        raise ValueError(f"the longest point needs {longest} tokens of context but the model allows "
                         f"{engine.max_model_len}; lower --contexts or the chunk sizes")
    return engine


def num_units(spec: ProfileSpec) -> int:
    """Grid points of every pass plus acceptance runs: the length of the progress bar."""
    return spec.passes * len(grid(spec)) + spec.max_k * len(spec.prompts or BUILTIN_PROMPTS)


def run_profile(spec: ProfileSpec, on_progress: Callable[[str], None] = lambda what: None) -> Profile:
    engine = build_engine(spec)
    table = engine.block_manager.reserve(_blocks_needed(spec, engine.config.block_size))
    log.info("profiling model=%s device=%s points=%d", spec.model, engine.device, len(grid(spec)))
    # A first pass pays for lazy kernel builds, per-shape set-up and allocator growth.
    for kind, batch, context, q in grid(spec):
        step = _prefill_step(context, q, table, engine.vocab_size) if kind == "prefill" else \
            _synthetic_step(batch, context, q, table, engine.vocab_size)
        engine.runner.execute(step)
    sweeps: list[list[StepPoint]] = []
    for sweep in range(spec.passes):
        sweeps.append([])
        for kind, batch, context, q in grid(spec):
            point = measure_point(engine, spec, kind, batch, context, q, table)
            log.debug("point pass=%d kind=%s batch=%d context=%d q=%d median_s=%.6f", sweep, kind, batch, context, q,
                      point.median_s)
            sweeps[-1].append(point)
            on_progress(f"pass {sweep + 1}: {kind} batch={batch} context={context} q={q}")
    points = [merge_passes(list(same)) for same in zip(*sweeps)]
    acceptance = measure_acceptance(engine, spec.prompts or BUILTIN_PROMPTS, spec.max_k, spec.max_tokens,
                                    on_progress)
    return Profile(model=spec.model, device=_device_name(engine.device), dtype=str(engine.dtype).removeprefix("torch."),
                   host=host_info(), engine_commit=engine_commit(),
                   created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   points=points, fit=fit_profile(points), acceptance=acceptance)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"


def engine_commit() -> str:
    here = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        if rev.returncode == 0 and rev.stdout.strip():
            return rev.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"specfleet {version('specfleet')}"
    except PackageNotFoundError:
        return "unknown"


def read_prompts(path: str | Path) -> dict[str, list[str]]:
    """A text file, one prompt per line; the workload is named after the file."""
    lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"{path} has no prompts")
    return {Path(path).stem: lines}
