"""Scrapes of engine metrics and the window between two of them.

A `Scrape` is one pod's cumulative counters, gauges and histograms at one instant (parsed from the
Prometheus text exposition, or produced by the fleet simulator). `build_window(prev, cur, expected)`
turns two rounds of scrapes into a `Window`: counter deltas become rates, histogram bucket deltas become
p50/p99 and the share of observations under a target, gauges are summed or averaged.

Unknown is never zero: a quantity with no evidence is `None`, and a window that lacks any expected pod
is `complete == False`; policies hold on such windows.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping

# Engine metric names (docs/design.md; counters without their `_total` suffix).
RUNNING, WAITING, KV_USAGE = "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"
PROMPT_TOKENS, GENERATION_TOKENS = "vllm:prompt_tokens", "vllm:generation_tokens"
DRAFTS, DRAFT_TOKENS = "vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
CF_DRAFT_TOKENS, CF_ACCEPTED_TOKENS = "specfleet:counterfactual_draft_tokens", "specfleet:counterfactual_accepted_tokens"
SPEC_SEQ_STEPS = "specfleet:spec_decode_seq_steps"
CF_SEQ_STEPS = "specfleet:counterfactual_seq_steps"
PROPOSAL_SEQ_STEPS, PROPOSED_TOKENS = "specfleet:ngram_proposal_seq_steps", "specfleet:ngram_proposed_tokens"
TTFT, ITL = "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"
E2E, ENDED = "vllm:e2e_request_latency_seconds", "vllm:request_success"
BATCH_SIZE, STEP_TIME = "specfleet:batch_size", "specfleet:step_duration_seconds"
STEP_SEQS, STEP_TOKENS = "specfleet:step_seqs", "specfleet:step_tokens"
SPEC_ENABLED, SPEC_K = "specfleet:speculation_enabled", "specfleet:num_speculative_tokens"
# The histograms whose buckets a window reads (p99, the share under a target). Of every other histogram,
# and of the step-time summary, it reads the count and sum alone, so a scrape keeps just those (the count as
# the +Inf bucket): the others' buckets are under a quarter of a real engine's series.
BUCKETED = (TTFT, ITL)


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts (Prometheus `le` semantics); the last bound is +inf."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    sum: float = 0.0

    @property
    def count(self) -> float:
        return self.counts[-1] if self.counts else 0.0

    def minus(self, older: "Histogram | None") -> "Histogram":
        """The observations since `older` (all of them after a reset or a bucket layout change)."""
        if older is None or older.bounds != self.bounds or older.count > self.count:
            return self
        return Histogram(self.bounds, tuple(a - b for a, b in zip(self.counts, older.counts)), self.sum - older.sum)

    def plus(self, other: "Histogram") -> "Histogram":
        if other.bounds != self.bounds:
            raise ValueError("histograms with different buckets")
        return Histogram(self.bounds, tuple(a + b for a, b in zip(self.counts, other.counts)), self.sum + other.sum)


def quantile(hist: Histogram | None, q: float) -> float | None:
    """`histogram_quantile` as Prometheus computes it; None without observations."""
    if hist is None or hist.count <= 0:
        return None
    rank, lower, below = q * hist.count, 0.0, 0.0
    for bound, cumulative in zip(hist.bounds, hist.counts):
        if cumulative >= rank:
            if math.isinf(bound):
                return lower
            width = cumulative - below
            return lower + (bound - lower) * ((rank - below) / width if width > 0 else 1.0)
        lower, below = bound, cumulative
    return lower


def share_below(hist: Histogram | None, target: float) -> float | None:
    """Share of observations <= `target`, interpolating inside the bucket that holds it."""
    if hist is None or hist.count <= 0:
        return None
    lower, below = 0.0, 0.0
    for bound, cumulative in zip(hist.bounds, hist.counts):
        if target < bound:
            inside = 0.0 if math.isinf(bound) else (cumulative - below) * (target - lower) / (bound - lower)
            return min(1.0, (below + inside) / hist.count)
        lower, below = bound, cumulative
    return 1.0


@dataclass(frozen=True)
class Scrape:
    """One pod's metrics at `time` (seconds). Labelled series other than `model_name` are keyed
    `name{label=value,...}` with the labels sorted."""

    time: float
    counters: Mapping[str, float] = field(default_factory=dict)
    gauges: Mapping[str, float] = field(default_factory=dict)
    histograms: Mapping[str, Histogram] = field(default_factory=dict)


def series_key(name: str, labels: Mapping[str, str]) -> str:
    extra = {k: v for k, v in labels.items() if k not in ("model_name", "le")}
    if not extra:
        return name
    return name + "{" + ",".join(f"{k}={v}" for k, v in sorted(extra.items())) + "}"


def parse_labels(key: str) -> tuple[str, dict[str, str]]:
    name, _, rest = key.partition("{")
    pairs = [p.split("=", 1) for p in rest.rstrip("}").split(",") if p]
    return name, dict(pairs)


@dataclass(frozen=True)
class StepStat:
    """Mean engine step of one batch-size bucket over a window (calibration input)."""

    batch: float
    seconds: float
    speculating: bool
    steps: float
    tokens: float | None = None     # mean tokens computed per step (decodes, verifications, prefill)


@dataclass(frozen=True)
class Window:
    """What the fleet did between two scrape rounds. Rates are per second; None means unknown."""

    start: float
    end: float
    pods_expected: int
    pods_scraped: int
    requests_per_second: float | None = None       # requests that got their first token
    finished_per_second: float | None = None       # requests that ended, aborted ones included
    queue_growth_per_second: float | None = None
    running_growth_per_second: float | None = None
    ttft: Histogram | None = None
    itl: Histogram | None = None
    batch_size_mean: float | None = None
    running: float | None = None
    queue_depth: float | None = None
    kv_cache_usage: float | None = None
    generation_tokens_per_second: float | None = None
    acceptance_rate: float | None = None             # accepted / drafted tokens while on
    mean_accepted_length: float | None = None        # 1 + accepted tokens per draft
    drafts: float | None = None                      # drafts verified in the window: the evidence behind both
    first_token_acceptance: float | None = None      # share of drafts whose first token was accepted
    counterfactual_acceptance_rate: float | None = None
    draft_share: float | None = None                 # drafted tokens / (k x decoding sequence-steps) while on
    draft_shares: tuple[float, ...] | None = None    # by depth 1, 2, ...: fresh n-gram proposals, on or off
    speculation_enabled: float | None = None         # share of pods with speculation on
    num_speculative_tokens: int | None = None
    steps: tuple[StepStat, ...] = ()

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def complete(self) -> bool:
        return self.pods_expected > 0 and self.pods_scraped >= self.pods_expected and self.seconds > 0

    def p(self, which: str, q: float) -> float | None:
        return quantile(self.ttft if which == "ttft" else self.itl, q)

    @property
    def ttft_p99(self) -> float | None:
        return quantile(self.ttft, 0.99)

    @property
    def itl_p99(self) -> float | None:
        return quantile(self.itl, 0.99)

    @property
    def output_tokens_per_request(self) -> float | None:
        if not self.requests_per_second or self.generation_tokens_per_second is None:
            return None
        return self.generation_tokens_per_second / self.requests_per_second

    def slo_attainment(self, ttft_s: float, itl_s: float) -> float | None:
        """Share of first tokens within the TTFT target times share of tokens within the ITL target."""
        a, b = share_below(self.ttft, ttft_s), share_below(self.itl, itl_s)
        if a is None and b is None:
            return None
        return (1.0 if a is None else a) * (1.0 if b is None else b)


def build_window(prev: Mapping[str, Scrape], cur: Mapping[str, Scrape], expected: int) -> Window | None:
    """The window between two scrape rounds; None when no pod was scraped both times."""
    known = [(prev[p], cur[p]) for p in cur if p in prev and cur[p].time > prev[p].time]
    if not known:
        return None
    start = min(a.time for a, _ in known)
    end = max(b.time for _, b in known)
    seconds = sum(b.time - a.time for a, b in known) / len(known)
    # A pod that became ready during the window started its counters from zero inside it.
    pairs = known + [(Scrape(start), cur[p]) for p in cur if p not in prev]
    d = _Deltas(pairs)
    now = [b for _, b in pairs]
    first = d.hist(TTFT)
    drafts, accepted = d.counter(DRAFT_TOKENS), d.counter(ACCEPTED_TOKENS)
    cf_drafts, cf_accepted = d.counter(CF_DRAFT_TOKENS), d.counter(CF_ACCEPTED_TOKENS)
    batch = d.hist(BATCH_SIZE)
    waiting_then = _gauge_sum([a for a, _ in known], WAITING)
    waiting_now = _gauge_sum(now, WAITING)
    running_then, running_now = _gauge_sum([a for a, _ in known], RUNNING), _gauge_sum(now, RUNNING)
    ended = d.family(ENDED)
    if ended is None and d.hist(E2E) is not None:     # the latency histogram leaves aborted requests out
        ended = d.hist(E2E).count
    return Window(
        start=start, end=end, pods_expected=expected, pods_scraped=len(pairs),
        requests_per_second=first.count / seconds if first is not None else None,
        finished_per_second=_rate(ended, seconds),
        queue_growth_per_second=(waiting_now - waiting_then) / seconds
        if None not in (waiting_now, waiting_then) else None,
        running_growth_per_second=(running_now - running_then) / seconds
        if None not in (running_now, running_then) else None,
        ttft=first, itl=d.hist(ITL),
        batch_size_mean=batch.sum / batch.count if batch is not None and batch.count > 0 else None,
        running=_gauge_sum(now, RUNNING), queue_depth=waiting_now, kv_cache_usage=_gauge_mean(now, KV_USAGE),
        generation_tokens_per_second=_rate(d.counter(GENERATION_TOKENS), seconds),
        acceptance_rate=accepted / drafts if drafts and accepted is not None else None,
        mean_accepted_length=1 + accepted / d.counter(DRAFTS) if d.counter(DRAFTS) and accepted is not None else None,
        drafts=d.counter(DRAFTS),
        first_token_acceptance=_share(d.counter(series_key(ACCEPTED_PER_POS, {"position": "0"})), d.counter(DRAFTS)),
        counterfactual_acceptance_rate=cf_accepted / cf_drafts if cf_drafts and cf_accepted is not None else None,
        draft_share=_draft_share(drafts, d.counter(SPEC_SEQ_STEPS), _int(_gauge_max(now, SPEC_K))),
        draft_shares=_draft_shares(d),
        speculation_enabled=_gauge_mean(now, SPEC_ENABLED),
        num_speculative_tokens=_int(_gauge_max(now, SPEC_K)),
        steps=d.steps())


def _draft_share(draft_tokens: float | None, seq_steps: float | None, k: int | None) -> float | None:
    """The share of full k-token drafts among decoding sequence-steps: n-gram drafts only where the context
    has a match, and then maybe fewer than k tokens. With it, share x rate x k (rate: accepted / drafted
    tokens) is the accepted tokens per sequence-step, and 1 + share x k the tokens a step computes each."""
    return _share(draft_tokens, None if seq_steps is None or not k else seq_steps * k)


def proposed_key(depth: int) -> str:
    """The series of n-gram proposal tokens counted at `depth` (each proposal capped at it)."""
    return series_key(PROPOSED_TOKENS, {"depth": str(depth)})


def _draft_shares(d: "_Deltas") -> tuple[float, ...] | None:
    """Share at each depth j: sum of min(L, j) over decoding sequence-steps / (j x those steps), L the
    length of a fresh n-gram proposal there. Counted the same way with speculation on and off, so the
    share the controller prices while off is the one it will see once on, at every k."""
    steps = d.counter(PROPOSAL_SEQ_STEPS)
    shares: list[float] = []
    for depth in itertools.count(1):
        share = _share(d.counter(proposed_key(depth)), steps * depth if steps else None)
        if share is None:
            break
        shares.append(share)
    return tuple(shares) or None


def _share(part: float | None, whole: float | None) -> float | None:
    """part / whole, within [0, 1]; None without evidence (an engine too old to export `whole`)."""
    if part is None or not whole:
        return None
    return min(1.0, max(0.0, part / whole))


class _Deltas:
    """Counter and histogram increases over pod pairs, summed over pods."""

    def __init__(self, pairs: list[tuple[Scrape, Scrape]]):
        self.pairs = pairs

    def counter(self, key: str) -> float | None:
        deltas = [_counter_delta(a.counters.get(key), b.counters.get(key)) for a, b in self.pairs]
        known = [x for x in deltas if x is not None]
        return sum(known) if known else None

    def family(self, name: str) -> float | None:
        """Summed increase of a counter over all its label sets (e.g. every finish reason)."""
        keys = {k for _, b in self.pairs for k in b.counters if k == name or k.startswith(name + "{")}
        deltas = [self.counter(k) for k in sorted(keys)]
        known = [x for x in deltas if x is not None]
        return sum(known) if known else None

    def hist(self, key: str) -> Histogram | None:
        total = None
        for a, b in self.pairs:
            if key in b.histograms:
                delta = b.histograms[key].minus(a.histograms.get(key))
                total = delta if total is None else total.plus(delta)
        return total

    def steps(self) -> tuple[StepStat, ...]:
        keys = {k for _, b in self.pairs for k in b.histograms if k.startswith(STEP_TIME + "{")}
        stats = []
        for key in sorted(keys):
            hist = self.hist(key)
            seqs = self.counter(STEP_SEQS + key[len(STEP_TIME):])
            tokens = self.counter(STEP_TOKENS + key[len(STEP_TIME):])
            if hist is None or hist.count <= 0 or not seqs:
                continue
            labels = parse_labels(key)[1]
            stats.append(StepStat(seqs / hist.count, hist.sum / hist.count, labels.get("speculating") == "true",
                                  hist.count, tokens / hist.count if tokens else None))
        return tuple(stats)


def _counter_delta(old: float | None, new: float | None) -> float | None:
    if new is None:
        return None
    if old is None or new < old:      # a new pod, or a restarted one: its counter started from zero
        return new
    return new - old


def _rate(delta: float | None, seconds: float) -> float | None:
    return None if delta is None or seconds <= 0 else delta / seconds


def _values(scrapes: Iterable[Scrape], key: str) -> list[float]:
    return [s.gauges[key] for s in scrapes if key in s.gauges]


def _gauge_sum(scrapes: list[Scrape], key: str) -> float | None:
    values = _values(scrapes, key)
    return sum(values) if len(values) == len(scrapes) else None


def _gauge_mean(scrapes: list[Scrape], key: str) -> float | None:
    values = _values(scrapes, key)
    return sum(values) / len(values) if values and len(values) == len(scrapes) else None


def _gauge_max(scrapes: list[Scrape], key: str) -> float | None:
    values = _values(scrapes, key)
    return max(values) if values else None


def _int(x: float | None) -> int | None:
    return None if x is None else int(round(x))
