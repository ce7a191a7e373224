"""Engine metrics in: a pod's Prometheus exposition, or its raw series from Prometheus, as one `Scrape`.

- `parse_exposition(text, time)`: Prometheus text exposition -> `Scrape`. Of a histogram outside
  `window.BUCKETED`, and of a summary, only the count (as the +Inf bucket) and the sum are kept: nothing
  reads the other buckets or quantiles.
- `scrape_pods(endpoints)`: GET `/metrics` of every pod concurrently with a timeout; a pod that fails is
  left out (unknown), never reported as zeros.
- `scrape_from_series(series, time)`: one pod's raw series as Prometheus returns them -> the same
  `Scrape`, so windows are computed identically from either source (`sources.py` queries).

The speculation switch (the loop's one write to a pod) is `speculation_switch.py`.
"""
from __future__ import annotations

import asyncio
import math
import time as _time
from typing import Mapping

import httpx
from prometheus_client.parser import text_string_to_metric_families

from specfleet.operator.control.window import BUCKETED, Histogram, Scrape, series_key

SCRAPE_TIMEOUT_S = 3.0
# vLLM labels every series with `engine`, the index of an engine core inside one server (data parallel);
# the control loop counts a pod as one, so its engines' series are summed as if the label were absent.
POD_WIDE_LABELS = ("engine",)


def parse_exposition(text: str, at: float) -> Scrape:
    """Counters (keyed without `_total`), gauges and histograms of one exposition."""
    counters: dict[str, float] = {}
    gauges: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(_without_unread_buckets(text)):
        for s in family.samples:
            labels = {k: v for k, v in s.labels.items() if k not in POD_WIDE_LABELS}
            _add_sample(family.type, family.name, s.name, labels, s.value, counters, gauges, buckets, sums)
    return Scrape(at, counters, gauges, _histograms(buckets, sums))


def _without_unread_buckets(text: str) -> str:
    """`text` less the bucket lines a scrape leaves out, so the parser never reads them."""
    read = tuple(f"{name}_bucket{{" for name in BUCKETED)
    return "\n".join(line for line in text.split("\n") if "_bucket{" not in line or line.startswith(read))


def _add_sample(kind, family, name, labels, value, counters, gauges, buckets, sums) -> None:
    if kind in ("untyped", "unknown") and name.endswith("_total"):
        kind = "counter"           # `# TYPE x counter` followed by `x_total` samples parses as untyped
    if kind in ("histogram", "summary"):
        _add_distribution(family, name[len(family) + 1:], labels, value, buckets, sums)
    elif kind == "counter":
        if not name.endswith("_created"):
            _add(counters, series_key(name.removesuffix("_total"), labels), value)
    elif kind in ("gauge", "untyped", "unknown"):
        _add(gauges, series_key(name, labels), value)


def _add_distribution(base: str, suffix: str, labels: dict, value: float, buckets: dict, sums: dict) -> None:
    """One sample of a histogram or summary: a bucket a window reads, or the count as the +Inf bucket where it
    reads none; the sum. A summary's quantiles and every other bucket are left out."""
    if suffix == "sum":
        _add(sums, series_key(base, labels), value)
    elif suffix == ("bucket" if reads_buckets(base) else "count"):
        bound = float(labels["le"]) if suffix == "bucket" else math.inf
        _add(buckets.setdefault(series_key(base, labels), {}), bound, value)


def _add(into: dict, key, value: float) -> None:
    into[key] = into.get(key, 0.0) + value


def reads_buckets(base: str) -> bool:
    """Whether a scrape keeps every bucket of histogram `base`: of those whose quantiles a window reads
    (`BUCKETED`); of the others it keeps the count (as the +Inf bucket) and the sum."""
    return base in BUCKETED


def _histograms(buckets: dict, sums: dict) -> dict[str, Histogram]:
    out = {}
    for key, by_bound in buckets.items():
        bounds = tuple(sorted(by_bound))
        out[key] = Histogram(bounds, tuple(by_bound[b] for b in bounds), sums.get(key, 0.0))
    return out


async def scrape_pods(endpoints: Mapping[str, str], timeout: float = SCRAPE_TIMEOUT_S,
                      client: httpx.AsyncClient | None = None) -> dict[str, Scrape]:
    """Scrape `{pod: base_url}`; pods that time out or fail are absent from the result."""
    own = client is None
    client = client or httpx.AsyncClient(timeout=timeout)
    try:
        results = await asyncio.gather(*(_scrape_one(client, url, timeout) for url in endpoints.values()))
    finally:
        if own:
            await client.aclose()
    return {pod: s for pod, s in zip(endpoints, results) if s is not None}


async def _scrape_one(client: httpx.AsyncClient, base_url: str, timeout: float) -> Scrape | None:
    try:
        response = await client.get(base_url.rstrip("/") + "/metrics", timeout=timeout)
        response.raise_for_status()
        return parse_exposition(response.text, _time.monotonic())
    except (httpx.HTTPError, ValueError):
        return None


def scrape_from_series(series: list[tuple[str, dict, float]], at: float) -> Scrape:
    """One pod's raw series from Prometheus (name, labels, value) -> the `Scrape` its exposition gives.

    Prometheus keeps no types, so they come from the names: series with an `le` label are histogram
    buckets, `<base>_count` and `<base>_sum` together a histogram's or summary's count and sum,
    `_total` series counters, the rest gauges.
    """
    counters: dict[str, float] = {}
    gauges: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    sums: dict[str, float] = {}
    names = {name for name, _, _ in series}
    counted = {name[:-6] for name in names if name.endswith("_count") and f"{name[:-6]}_sum" in names}
    for name, labels, value in series:
        labels = {k: v for k, v in labels.items() if k in SERIES_LABELS}
        base, _, suffix = name.rpartition("_")
        if suffix == "bucket" and "le" in labels or suffix in ("count", "sum") and base in counted:
            _add_distribution(base, suffix, labels, value, buckets, sums)
        elif suffix == "total":
            _add(counters, series_key(base, labels), value)
        else:
            _add(gauges, series_key(name, labels), value)
    return Scrape(at, counters, gauges, _histograms(buckets, sums))


SERIES_LABELS = ("model_name", "le", "batch_size_bucket", "speculating", "finished_reason", "reason", "position",
                 "host")
