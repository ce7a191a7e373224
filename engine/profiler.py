"""Measure an engine's cost profile: step time T(batch, context, q) on the real model runner.

Each grid point lays out a synthetic step (batch sequences of `context` cached tokens, each computing q
tokens) and times `ModelRunner.execute` over the paged KV cache, after warm-up, as the median of
repeats. The sequences share one block table: attention reads and writes the same number of slots as
real sequences would, and the values in them do not matter for the cost. n-gram acceptance comes
from generating on a prompt set with speculation on and reading the engine's counters.
"""
from __future__ import annotations

import logging
import os
import platform
import statistics
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import torch

from specfleet.engine.config import EngineConfig
from specfleet.engine.engine import LLMEngine
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
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError("repeats must be >= 1 and warmup >= 0")
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


def _step(kind: str, batch: int, context: int, q: int, table: list[int], vocab: int) -> SchedulerOutput:
    if kind == "prefill":
        return _prefill_step(context, q, table, vocab)
    return _synthetic_step(batch, context, q, table, vocab)


def time_step(engine: LLMEngine, step: SchedulerOutput, warmup: int, repeats: int) -> list[float]:
    sync = torch.cuda.synchronize if engine.device.type == "cuda" else (lambda: None)
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


def measure_point(engine: LLMEngine, spec: ProfileSpec, kind: str, batch: int, context: int, q: int,
                  table: list[int]) -> StepPoint:
    times = time_step(engine, _step(kind, batch, context, q, table, engine.vocab_size), spec.warmup, spec.repeats)
    return StepPoint(kind, batch, context, q, statistics.median(times), max(times) - min(times), len(times))


def measure_acceptance(engine: LLMEngine, prompts: dict[str, list[str] | list[list[int]]], max_k: int,
                       max_tokens: int, on_progress: Callable[[str], None] = lambda what: None) -> list[Acceptance]:
    results = []
    for k in range(1, max_k + 1):
        engine.set_speculation(enabled=True, num_speculative_tokens=k)
        for workload, texts in prompts.items():
            drafted, accepted = engine.stats.spec_draft_tokens, engine.stats.spec_accepted_tokens
            _generate(engine, texts, max_tokens, f"{workload}-k{k}")
            results.append(Acceptance(workload, k, engine.stats.spec_draft_tokens - drafted,
                                      engine.stats.spec_accepted_tokens - accepted))
            on_progress(f"n-gram acceptance {workload} k={k}")
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
    # Room for the grid's shared block table and for the acceptance runs' generations.
    num_blocks = max(_blocks_needed(spec, BLOCK_SIZE) + 1, 512)
    config = EngineConfig(model=spec.model, block_size=BLOCK_SIZE, num_kv_blocks=num_blocks, device=spec.device,
                          dtype=spec.dtype, speculative_method="ngram", num_speculative_tokens=spec.max_k,
                          enable_prefix_caching=False)
    engine = LLMEngine(config)
    longest = _longest(spec)
    if longest > engine.max_model_len:
        raise ValueError(f"the longest point needs {longest} tokens of context but the model allows "
                         f"{engine.max_model_len}; lower --contexts or the chunk sizes")
    return engine


def num_units(spec: ProfileSpec) -> int:
    """Grid points plus acceptance runs: the length of the progress bar."""
    return len(grid(spec)) + spec.max_k * len(spec.prompts or BUILTIN_PROMPTS)


def run_profile(spec: ProfileSpec, on_progress: Callable[[str], None] = lambda what: None) -> Profile:
    engine = build_engine(spec)
    table = list(range(_blocks_needed(spec, engine.config.block_size)))
    log.info("profiling model=%s device=%s points=%d", spec.model, engine.device, len(grid(spec)))
    # A first pass over the grid pays for lazy kernel builds, per-shape set-up and allocator growth.
    for kind, batch, context, q in grid(spec):
        engine.runner.execute(_step(kind, batch, context, q, table, engine.vocab_size))
    points = []
    for kind, batch, context, q in grid(spec):
        point = measure_point(engine, spec, kind, batch, context, q, table)
        log.debug("point kind=%s batch=%d context=%d q=%d median_s=%.6f", kind, batch, context, q, point.median_s)
        points.append(point)
        on_progress(f"{kind} batch={batch} context={context} q={q}")
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


def host_info() -> dict:
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                 if line.startswith("model name")]
        model = names[0] if names else model
    return {"cpu": model, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads()}


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
