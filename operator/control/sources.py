"""Where a control step's engine series come from: the pods themselves, or Prometheus.

- `DirectSource`: GET `/metrics` of every pod of the service (the default, and the fallback).
- `PrometheusSource`: a fleet-wide snapshot of every engine series, shared by all services' steps while it
  is younger than `max_age_s`. Each pod carries its sample time (`timestamp()`), so a pod whose samples
  are older than `stale_after_s`, that Prometheus does not have, or whose series hold NaN is scraped
  directly instead, and Prometheus down means every pod is. A refresh asks first for every pod's sample
  time, then for the digest (a sum of its values) of the pods sampled since the last snapshot, then for
  the series of those whose digest moved, by name, a hundred pods to a query, parsed in a thread (a big
  answer would hold up every handler), and keeps the others' scrapes (Prometheus scrapes pods
  at offsets spread over its interval, so each refresh finds some pods newer and most not; an idle pod's
  values do not move, and its scrape is only restamped with the new sample time). Windows come out the
  same from either source: the raw counters, gauges and histograms, stamped with the time they were sampled.

`SourceReport` says which source served a step and why; the runner puts it in a `MetricsSource`
condition and the operator's `specfleet_metrics_source` gauge.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Collection, Mapping

import httpx

from specfleet.operator.control import telemetry
from specfleet.operator.control.window import BUCKETED, Scrape
from specfleet.operator.control.scrape import SERIES_LABELS
from specfleet.operator.control.scrape import scrape_pods, scrape_from_series
from specfleet.operator.threads import in_parse_thread

log = logging.getLogger("specfleet.operator.control")

SERVED = 'inferenceservice!=""'
PER_POD_LABEL = "specfleet_pod"
# Each series comes with only the labels a `Scrape` keeps (`scrape_from_series` sums over the others, as
# the `sum` does): the target labels Prometheus adds (job, instance, the service's...) made most of the
# answer, and decoding it most of an idle operator's CPU.
_BY = ", ".join(("__name__", "namespace", "pod", *SERIES_LABELS))


def kept_series(matchers: str = "") -> str:
    """The engine series a `Scrape` keeps, named by selectors: every one but buckets, and the buckets of the
    histograms a window reads (`BUCKETED`). A set operator filtering every series (`unless`) cost Prometheus
    more CPU than the smaller answer saved. `matchers`: more label matchers, each after a comma."""
    bucketed = "|".join(f"{name}_bucket" for name in BUCKETED)
    return f'{_unbucketed(matchers)} or {{__name__=~"{bucketed}",{SERVED}{matchers}}}'


def _unbucketed(matchers: str) -> str:
    return f'{{__name__=~"(vllm|specfleet):.*",__name__!~".*_bucket",{SERVED}{matchers}}}'


def sampled(matchers: str = "") -> str:
    """Each pod's sample time. The query API stamps values with the evaluation time, which says nothing of
    how old the data is: a pod's sample time is the timestamp of one series every engine exports."""
    return f'max by (namespace, pod) (timestamp(vllm:num_requests_running{{{SERVED}{matchers}}}))'


def series_query(pods: Collection[str] | None = None) -> str:
    """Every engine series a `Scrape` keeps and, as two more series per pod, its sample time and digest; of
    the pods named when given."""
    matchers = "" if pods is None else _named(pods)
    return f"sum by ({_BY}) ({kept_series(matchers)}) or {_per_pod_series(matchers)}"


def digest_query(pods: Collection[str]) -> str:
    """The sample time and digest of the pods named."""
    return _per_pod_series(_named(pods))


def _per_pod_series(matchers: str) -> str:
    """Each pod's sample time and digest, told apart by `PER_POD_LABEL` ("time", "digest"). The digest is
    the sum of the pod's values but buckets (a bucket moves only with its histogram's count): it is the same
    from one sample to the next while they are, as an idle engine's are, so a refresh need not fetch them.
    Only a change whose parts cancel exactly in the sum, with no counter moving, would pass unseen."""
    digest = f"sum by (namespace, pod) ({_unbucketed(matchers)})"
    return f'{_labelled(sampled(matchers), "time")} or {_labelled(digest, "digest")}'


def _labelled(per_pod: str, what: str) -> str:
    return f'label_replace({per_pod}, "{PER_POD_LABEL}", "{what}", "", "")'


def _named(pods: Collection[str]) -> str:
    """A matcher of the pods by name, in every namespace (a name elsewhere costs a few series, and only the
    pods asked for are read): a selector reads the named pods' series alone, where a filter after it (`and`)
    read every pod's. A pod name is a DNS subdomain: of its characters only "." means more in a regex
    (escaped once for the regex, once more for the PromQL string)."""
    return ',pod=~"' + "|".join(sorted(pod.replace(".", r"\\.") for pod in pods)) + '"'


SAMPLE_TIMES_QUERY = _labelled(sampled(), "time")
# The series of this many pods to a query: decoding an answer holds up every handler (the parse after it runs
# in a thread), so no answer holds a whole fleet's.
PODS_PER_QUERY = 100
DEFAULT_STALE_AFTER_S = 60.0            # four missed scrapes at the PodMonitor's 15 s
# A query answers for many pods, so it may take longer than one pod's scrape (`scrape.SCRAPE_TIMEOUT_S`):
# giving up on it means scraping every pod directly, which costs the operator far more than the wait.
QUERY_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class SourceReport:
    """Which source served a step: `source` "prometheus" | "direct"; `reason` a condition reason."""

    source: str
    reason: str
    message: str
    preferred: bool                   # the configured source served every pod


class DirectSource:
    """Scrape each pod's `/metrics` (a pod that fails is left out, never reported as zeros)."""

    name = "direct"
    stale_after_s = 0.0               # every scrape is a new sample: nothing to wait for

    def __init__(self, http: httpx.AsyncClient | None = None):
        self.http = http

    async def scrape(self, namespace: str, endpoints: Mapping[str, str]) -> tuple[dict[str, Scrape], SourceReport]:
        scrapes = await scrape_pods(endpoints, client=self.http) if endpoints else {}
        return scrapes, SourceReport("direct", "DirectScrape", "metrics scraped from each engine pod", True)

    def news(self, namespace: str, endpoints: Mapping[str, str], seen: Mapping[str, Scrape]) -> bool | None:
        """Unknown before scraping (and a direct scrape is always a new sample)."""
        return None


@dataclass
class Snapshot:
    """One fleet-wide query: scrapes by (namespace, pod), or the error that prevented it."""

    taken: float                                  # monotonic
    scrapes: dict[tuple[str, str], Scrape]
    sampled: dict[tuple[str, str], float]         # wall-clock sample time per pod
    dropped_nan: frozenset[tuple[str, str]]
    error: str | None = None
    digests: dict[tuple[str, str], float] = field(default_factory=dict)   # of each pod's sample


class PrometheusSource:
    """The fleet's engine series from a Prometheus server, falling back to `DirectSource` per pod."""

    name = "prometheus"

    def __init__(self, url: str, http: httpx.AsyncClient | None = None, max_age_s: float = 5.0,
                 stale_after_s: float = DEFAULT_STALE_AFTER_S, timeout: float = QUERY_TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time):
        self.url, self.http, self.timeout = url.rstrip("/"), http, timeout
        self.max_age_s, self.stale_after_s, self.clock, self.wall = max_age_s, stale_after_s, clock, wall
        self.direct = DirectSource(http)
        self.snapshot: Snapshot | None = None
        self.queries = 0
        self.lock = asyncio.Lock()
        self.last_error: str | None = None

    async def scrape(self, namespace: str, endpoints: Mapping[str, str]) -> tuple[dict[str, Scrape], SourceReport]:
        if not endpoints:
            return {}, SourceReport("prometheus", "Prometheus", "no engine pods", True)
        snap = await self.fleet()
        fresh, missing = self._split(snap, namespace, endpoints)
        direct = await scrape_pods({p: endpoints[p] for p in missing}, client=self.http) if missing else {}
        return {**fresh, **direct}, self._report(snap, missing, len(endpoints))

    def news(self, namespace: str, endpoints: Mapping[str, str], seen: Mapping[str, Scrape]) -> bool | None:
        """Whether `scrape` would now answer, without I/O, a sample newer than the one in `seen` for every pod
        (True) or for none (False): the shared snapshot is young enough to serve as it is and holds each pod's
        sample, still fresh. None where unsure (a refresh due, a pod missing, new or gone stale, Prometheus
        failing) or where some pods have a newer sample and some not."""
        snap = self.snapshot
        if not endpoints or snap is None or snap.error is not None or self.clock() - snap.taken >= self.max_age_s:
            return None
        oldest, newer = self.wall() - self.stale_after_s, set()
        for pod in endpoints:
            scrape = snap.scrapes.get((namespace, pod))
            if scrape is None or pod not in seen or snap.sampled[(namespace, pod)] < oldest:
                return None
            newer.add(scrape.time > seen[pod].time)
        return newer.pop() if len(newer) == 1 else None

    async def fleet(self) -> Snapshot:
        """The shared snapshot, refreshed once older than `max_age_s` (one refresh at a time)."""
        async with self.lock:
            if self.snapshot is None or self.clock() - self.snapshot.taken >= self.max_age_s:
                self.snapshot = await self._refresh()
                if self.snapshot.error:
                    telemetry.PROMETHEUS_QUERIES.labels("error").inc()
                self._log_transition(self.snapshot.error)
            return self.snapshot

    async def _refresh(self) -> Snapshot:
        """Every pod's sample time; of the pods sampled since the last good snapshot, the digest; then the
        series of those whose digest moved (of every pod when there is no snapshot), `PODS_PER_QUERY` pods
        to a query. A pod whose digest did not move keeps its scrape at the new sample time: what its series
        would give."""
        taken = self.clock()
        before = self.snapshot if self.snapshot is not None and self.snapshot.error is None else None
        try:
            client = self.http or httpx.AsyncClient(timeout=self.timeout)
            try:
                times = _per_pod_values(await self._query(client, SAMPLE_TIMES_QUERY))["time"]
                newer = {key for key, t in times.items() if before is None or before.sampled.get(key) != t}
                still: set[tuple[str, str]] = set()
                result = []
                if held := {key for key in newer if before is not None and key in before.scrapes}:
                    result = await self._query(client, digest_query({pod for _, pod in held}))
                    still = {key for key, d in _per_pod_values(result)["digest"].items()
                             if key in held and before.digests.get(key) == d}
                moved = sorted({pod for namespace, pod in newer if (namespace, pod) not in still})
                for first in range(0, len(moved), PODS_PER_QUERY):
                    result += await self._query(client, series_query(moved[first:first + PODS_PER_QUERY]))
            finally:
                if self.http is None:
                    await client.aclose()
        except (httpx.HTTPError, httpx.InvalidURL, KeyError, ValueError, TypeError) as exc:
            return Snapshot(taken, {}, {}, frozenset(), error=f"{type(exc).__name__}: {str(exc)[:200]}")
        # In a thread: parsing a fleet's series on the event loop would hold up every handler.
        return await in_parse_thread(self._parse, taken, result, times, still)

    async def _query(self, client: httpx.AsyncClient, query: str) -> list[dict]:
        # POST: a query naming a thousand pods is longer than some proxies take in a URL.
        response = await client.post(f"{self.url}/api/v1/query", data={"query": query}, timeout=self.timeout)
        response.raise_for_status()
        body = response.json()
        if body.get("status") != "success":
            raise ValueError(f"query failed: {body.get('error', body)}")
        self.queries += 1
        telemetry.PROMETHEUS_QUERIES.labels("ok").inc()
        return body["data"]["result"]

    def _parse(self, taken: float, result: list[dict], times: dict[tuple[str, str], float] | None = None,
               still: Collection[tuple[str, str]] = ()) -> Snapshot:
        """Series grouped by pod; a pod with any NaN or infinite sample is dropped whole. `times`: every pod's
        sample time, where `result` holds only the pods sampled since the last snapshot. A pod whose sample
        time is the one the previous snapshot had keeps that snapshot's `Scrape`, or its NaN (the same
        sample: the same values, and the same time, which a step reads as no new sample). A pod in `still`
        (sampled anew, its series unmoved) keeps that `Scrape`'s values at its new sample time."""
        per_pod = _per_pod_values(result)      # the answers' sample times (newer than `times`) and digests
        sampled = {**(times or {}), **per_pod["time"]}
        before = self.snapshot if self.snapshot is not None and self.snapshot.error is None else None
        offset = self.clock() - self.wall()           # wall-clock sample time -> this process's monotonic clock
        same = {key for key, t in sampled.items() if before is not None and before.sampled.get(key) == t}
        kept = {key: before.scrapes[key] for key in same if key in before.scrapes}
        kept.update({key: replace(before.scrapes[key], time=sampled[key] + offset) for key in still})
        digests = {key: before.digests[key] for key in same if key in before.digests} if before is not None else {}
        digests.update(per_pod["digest"])
        nan = {key for key in same if key in before.dropped_nan} if before is not None else set()
        series: dict[tuple[str, str], list[tuple[str, dict, float]]] = {}
        for item in result:
            key = _pod_of(item.get("metric") or {})
            if key is None or key in same or "__name__" not in item["metric"]:
                continue
            value = float(item["value"][1])
            if not math.isfinite(value):
                nan.add(key)
            else:
                metric = {k: v for k, v in item["metric"].items() if k not in ("namespace", "pod", "__name__")}
                series.setdefault(key, []).append((item["metric"].get("__name__", ""), metric, value))
        scrapes = {key: scrape_from_series(rows, sampled[key] + offset)
                   for key, rows in series.items() if key in sampled and key not in nan}
        return Snapshot(taken, {**kept, **scrapes}, sampled, frozenset(nan), digests=digests)

    def _split(self, snap: Snapshot, namespace: str, endpoints: Mapping[str, str]
               ) -> tuple[dict[str, Scrape], list[str]]:
        """Pods Prometheus has fresh data for, and the rest (to scrape directly)."""
        now = self.wall()
        fresh = {pod: snap.scrapes[(namespace, pod)] for pod in endpoints
                 if (namespace, pod) in snap.scrapes and now - snap.sampled[(namespace, pod)] <= self.stale_after_s}
        return fresh, [pod for pod in endpoints if pod not in fresh]

    def _report(self, snap: Snapshot, missing: list[str], total: int) -> SourceReport:
        if snap.error is not None:
            return SourceReport("direct", "PrometheusUnavailable",
                                f"Prometheus at {self.url} failed ({snap.error}); scraping each pod directly", False)
        if not missing:
            return SourceReport("prometheus", "Prometheus", f"metrics from Prometheus at {self.url}", True)
        why = "NaN samples" if any(key[1] in missing for key in snap.dropped_nan) else \
            f"no series or none newer than {self.stale_after_s:g} s"
        return SourceReport("prometheus" if len(missing) < total else "direct", "PrometheusStale",
                            f"Prometheus has {why} for {len(missing)} of {total} pod(s) ({', '.join(sorted(missing)[:5])}); "
                            "those are scraped directly", False)

    def _log_transition(self, error: str | None) -> None:
        if error != self.last_error:
            if error is None:
                log.info("metrics source: Prometheus at %s answers again", self.url)
            else:
                log.warning("metrics source: Prometheus at %s failed (%s); falling back to direct scrapes",
                            self.url, error)
        self.last_error = error


def _per_pod_values(result: list[dict]) -> dict[str, dict[tuple[str, str], float]]:
    """A query's per-pod series (`_per_pod_series`) by kind: {"time": {(namespace, pod): wall-clock sample
    time}, "digest": {(namespace, pod): digest}}, in one pass over the answer."""
    kinds: dict[str, dict[tuple[str, str], float]] = {"time": {}, "digest": {}}
    for item in result:
        metric = item.get("metric") or {}
        if metric.get(PER_POD_LABEL) in kinds and (key := _pod_of(metric)) is not None:
            kinds[metric[PER_POD_LABEL]][key] = float(item["value"][1])
    return kinds


def _pod_of(metric: dict) -> tuple[str, str] | None:
    key = (metric.get("namespace", ""), metric.get("pod", ""))
    return key if all(key) else None


def source_for(prometheus_url: str | None, http: httpx.AsyncClient | None, **options) -> DirectSource | PrometheusSource:
    return PrometheusSource(prometheus_url, http, **options) if prometheus_url else DirectSource(http)
