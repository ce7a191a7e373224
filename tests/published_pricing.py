"""Published speculative-decoding measurements, priced with the operator's roofline and with its former one.

`load()` reads tests/data/published_speculation.yaml into `Series`; `roofline_speedup` prices one
series at one batch with the operator's current pricing, reached only through `current_pricing` (the
one place to change when the cost code moves); `former_speedup` prices it as the operator did before
this comparison changed it (`max(memory, compute)`, a full t_fixed per draft forward: docs/speculation-gpu.md),
kept here only to show what the change bought; `break_even` finds where a priced speed-up crosses 1.
Used by tests/operator/test_published_speculation.py and benchmarks/published_speculation.py. Pure.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

from specfleet.operator import cost as pm        # the cost package: reached through `current_pricing` and
from specfleet.operator.api import ARCH_FIELDS   # the former pricing's shape arithmetic only
from specfleet.operator.catalogs import gpus, models

DATA = Path(__file__).parent / "data" / "published_speculation.yaml"
PRICINGS = ("roofline", "former")
LIMIT = 4096


@dataclass(frozen=True)
class Draft:
    """What proposes: a model shape read at `ctx` tokens of context (None: the target's context)."""

    name: str
    shape: pm.Architecture
    ctx: int | None = None


@dataclass(frozen=True)
class Series:
    """One published speed-up-versus-batch figure and the configuration it measured."""

    id: str
    source: str
    gpu: str
    gpus: int
    model: str
    draft: Draft
    ks: tuple[int, ...]             # speculation depth at each batch (one value: the same at all)
    alpha: float
    ctx: int
    batches: tuple[int, ...]
    speedups: tuple[float, ...]
    break_even: tuple[int, int | None]
    agrees: dict                    # pricing -> {"value": bool, "reason": str}

    def k_at(self, batch: float) -> int:
        """The depth the source ran at the measured batch nearest `batch`."""
        nearest = min(range(len(self.batches)), key=lambda i: abs(self.batches[i] - batch))
        return self.ks[nearest] if len(self.ks) > 1 else self.ks[0]


def load(path: Path = DATA) -> tuple[list[Series], dict]:
    """The priced series and the whole file (for its unpriced entries and citations)."""
    raw = yaml.safe_load(path.read_text())
    drafts = {name: _draft(name, d) for name, d in raw["drafts"].items()}
    return [_series(s, drafts, raw["acceptance"]) for s in raw["series"]], raw


def _draft(name: str, raw: dict) -> Draft:
    if "architecture" in raw:
        arch = pm.Architecture(**{py: int(raw["architecture"][k]) for k, py in ARCH_FIELDS.items()})
    else:
        arch = models().by_name[raw["model"]]
    return Draft(name, arch.with_dtype("bfloat16"), raw.get("ctx"))


def _series(s: dict, drafts: dict[str, Draft], acceptance: dict) -> Series:
    ks = tuple(s["k"]) if isinstance(s["k"], list) else (s["k"],)
    lo, hi = s["break_even"]
    return Series(s["id"], s["source"], s["gpu"], s["gpus"], s["model"], drafts[s["draft"]], ks,
                  acceptance[s["acceptance"]]["alpha"], s["ctx"], tuple(s["batches"]),
                  tuple(s["speedups"]), (lo, hi), s["agrees"])


def published_break_even(batches: tuple[int, ...], speedups: tuple[float, ...]) -> tuple[int, int | None]:
    """[last batch above 1, first batch at or below 1] of a measured curve; (0, first) when it never pays,
    (last, None) when it pays throughout."""
    for i, s in enumerate(speedups):
        if s <= 1.0:
            return (batches[i - 1] if i else 0, batches[i])
    return batches[-1], None


# --- the operator's current pricing: the only place that calls it -------------------------------

def current_pricing(gpu: str, count: int, model: str) -> tuple[pm.StepCost, pm.Calibration, pm.Architecture]:
    """The roofline the planner prices a (model, accelerator x count) with when it has no profile."""
    cal = gpus()[gpu].calibration(count)
    shape = models().by_name[model].with_dtype("bfloat16")
    return pm.Roofline(shape, cal), cal, shape


def roofline_speedup(s: Series, batch: float) -> float:
    """Goodput with speculation at the series' depth over goodput without, as the operator prices it."""
    cost, cal, shape = current_pricing(s.gpu, s.gpus, s.model)
    k = s.k_at(batch)
    draft = pm.draft_time_fn(s.draft.shape, shape, cal, s.draft.ctx or s.ctx)
    return pm.goodput(cost, batch, s.ctx, s.alpha, k, draft) / pm.goodput(cost, batch, s.ctx, s.alpha, 0, draft)


# --- the former pricing (docs/speculation-gpu.md): not used by the operator --------------------

def former_step(shape: pm.Architecture, cal: pm.Calibration, batch: float, ctx: int, q: float) -> float:
    """The step time the operator priced before: the larger of the weight-and-KV stream and the matmul
    FLOP (2 x parameters a token, no attention), plus t_fixed."""
    memory = (pm.weights_bytes(shape) + batch * ctx * pm.kv_bytes_per_token(shape)) / cal.bw_eff
    compute = 2 * shape.parameters * batch * q / cal.flops_eff
    return max(memory, compute) + cal.t_fixed


def former_speedup(s: Series, batch: float) -> float:
    """The former speed-up: every draft forward a full step, t_fixed included."""
    _, cal, shape = current_pricing(s.gpu, s.gpus, s.model)
    k = s.k_at(batch)
    drafts = k * former_step(s.draft.shape, cal, batch, s.draft.ctx or s.ctx, 1)
    speculative = former_step(shape, cal, batch, s.ctx, k + 1) + drafts
    return pm.expected_tokens(s.alpha, k) * former_step(shape, cal, batch, s.ctx, 1) / speculative


SPEEDUP: dict[str, Callable[[Series, float], float]] = {"roofline": roofline_speedup, "former": former_speedup}


def break_even(speedup: Callable[[float], float], start: float = 1, limit: int = LIMIT) -> float:
    """The first batch (to 0.01) from `start` on at which `speedup` falls to 1 or below: 0 when it does not
    pay at `start`, inf when it still pays at `limit`. `start` is the smallest measured batch: a curve
    that rises with the batch (long contexts) may not pay below it and pay throughout the measured range.
    Scans a grid (every batch to 64, then 1/16 apart) so that a curve that rises before it falls is not
    misread."""
    if speedup(start) <= 1.0:
        return 0.0
    grid = [start, *range(math.floor(start) + 1, 65)]
    while grid[-1] < limit:
        grid.append(min(limit, math.ceil(grid[-1] * 1.0625)))
    for lo, hi in zip(grid, grid[1:]):
        if speedup(hi) <= 1.0:
            while hi - lo > 0.01:
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if speedup(mid) > 1.0 else (lo, mid)
            return hi
    return math.inf


def priced_break_even(s: Series, pricing: str) -> float:
    """Where a pricing puts the series' crossing of speed-up 1, from its smallest measured batch on."""
    return break_even(lambda b: SPEEDUP[pricing](s, b), start=s.batches[0])


def within(value: float, published: tuple[int, int | None]) -> bool:
    """A priced break-even inside the published range [lo, hi] (hi None: anywhere past lo)."""
    lo, hi = published
    return value >= lo and (hi is None or value <= hi)
