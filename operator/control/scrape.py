"""Engine metrics in: a pod's Prometheus exposition, or its raw series from Prometheus, as one `Scrape`.

- `parse_exposition(text, time)`: Prometheus text exposition -> `Scrape`. Of a histogram outside
  `window.BUCKETED` only the +Inf bucket (the count) and the sum are kept: nothing reads its other buckets.
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
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = {k: v for k, v in s.labels.items() if k not in POD_WIDE_LABELS}
            _add_sample(family.type, s.name, labels, s.value, counters, gauges, buckets, sums)
    return Scrape(at, counters, gauges, _histograms(buckets, sums))


def _add_sample(kind, name, labels, value, counters, gauges, buckets, sums) -> None:
    if kind in ("untyped", "unknown") and name.endswith("_total"):
        kind = "counter"           # `# TYPE x counter` followed by `x_total` samples parses as untyped
    if kind == "histogram":
        base, _, suffix = name.rpartition("_")
        key = series_key(base, labels)
        if suffix == "bucket" and keeps_bucket(base, float(labels["le"])):
            buckets.setdefault(key, {})[float(labels["le"])] = buckets.get(key, {}).get(float(labels["le"]), 0) + value
        elif suffix == "sum":
            sums[key] = sums.get(key, 0.0) + value
    elif kind == "counter":
        key = series_key(name.removesuffix("_total"), labels)
        if not name.endswith("_created"):
            counters[key] = counters.get(key, 0.0) + value
    elif kind in ("gauge", "untyped", "unknown"):
        key = series_key(name, labels)
        gauges[key] = gauges.get(key, 0.0) + value


def keeps_bucket(base: str, bound: float) -> bool:
    """Whether a scrape keeps the bucket `bound` of histogram `base`: every bucket of those whose quantiles
    a window reads (`BUCKETED`), the +Inf bucket (the count) of the others."""
    return base in BUCKETED or math.isinf(bound)


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
    buckets (and `<base>_sum` their sums), `_total` series are counters, the rest gauges.
    """
    counters: dict[str, float] = {}
    gauges: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    sums: dict[str, float] = {}
    bases = {name.removesuffix("_bucket") for name, labels, _ in series if "le" in labels}
    for name, labels, value in series:
        labels = {k: v for k, v in labels.items() if k in SERIES_LABELS}
        base = name.rpartition("_")[0]
        if "le" in labels:
            if not keeps_bucket(base, float(labels["le"])):
                continue
            key = series_key(base, labels)
            slot = buckets.setdefault(key, {})
            slot[float(labels["le"])] = slot.get(float(labels["le"]), 0.0) + value
        elif base in bases:
            if name.endswith("_sum"):
                sums[series_key(base, labels)] = sums.get(series_key(base, labels), 0.0) + value
        elif name.endswith("_total"):
            key = series_key(name.removesuffix("_total"), labels)
            counters[key] = counters.get(key, 0.0) + value
        else:
            key = series_key(name, labels)
            gauges[key] = gauges.get(key, 0.0) + value
    return Scrape(at, counters, gauges, _histograms(buckets, sums))


SERIES_LABELS = ("model_name", "le", "batch_size_bucket", "speculating", "finished_reason", "reason", "position")
