"""Where the control loop's engine series come from (`control/sources.py`): a real Prometheus scraping
stand-in engine pods gives the same scrapes as the pods themselves, one query serves every service, and
Prometheus down, stale, missing a pod or holding NaN falls back to direct scrapes pod by pod, saying why."""
from __future__ import annotations

import asyncio
import math
import re
import time
from urllib.parse import parse_qs, urlparse

import httpx
import pytest

from prometheus_kit import running_prometheus
from specfleet.operator.control.sources import (PER_POD_LABEL, PODS_PER_QUERY, SAMPLE_TIMES_QUERY, DirectSource,
                                                PrometheusSource, digest_query, series_query)
from specfleet.operator.control.window import build_window
from testkit import free_port
from tests.control.exposition_kit import engine_exposition, serving

NS, SERVICE = "prod", "chat"


def scrape_config(endpoints: dict[str, str], namespace: str = NS) -> dict:
    """A static config labelling each stand-in as the PodMonitor labels an engine pod."""
    return {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "engines", "scrape_interval": "1s", "static_configs": [
                {"targets": [urlparse(url).netloc],
                 "labels": {"namespace": namespace, "pod": pod, "inferenceservice": SERVICE}}
                for pod, url in endpoints.items()]}]}


async def until(probe, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (value := await probe()):
            return value
        await asyncio.sleep(0.25)
    raise AssertionError("condition not reached")


async def scraped_by_prometheus(source: PrometheusSource, endpoints: dict[str, str]):
    async def probe():
        source.snapshot = None
        scrapes, report = await source.scrape(NS, endpoints)
        return (scrapes, report) if report.reason == "Prometheus" else None
    return await until(probe)


async def test_prometheus_gives_the_scrapes_the_pods_give(tmp_path, fake_engine_pods):
    engines, endpoints = fake_engine_pods(2)
    with running_prometheus(tmp_path, scrape_config(endpoints)) as prometheus:
        source = PrometheusSource(prometheus.url, max_age_s=0.0)
        first, report = await scraped_by_prometheus(source, endpoints)
        direct, _ = await DirectSource().scrape(NS, endpoints)
        assert report.source == "prometheus" and report.preferred
        for pod in endpoints:
            assert set(first[pod].counters) == set(direct[pod].counters)
            assert set(first[pod].gauges) <= set(direct[pod].gauges)
            assert set(first[pod].histograms) == set(direct[pod].histograms)
        await asyncio.sleep(2.5)
        second, _ = await source.scrape(NS, endpoints)
    window = build_window(first, second, expected=2)
    assert window is not None and window.complete
    # Each stand-in starts one request a second per 0.5 rps; two pods: about 1 request a second.
    assert window.requests_per_second == pytest.approx(2 * engines[0].rps, rel=0.35)


async def test_of_a_real_engine_prometheus_answers_only_the_series_a_scrape_keeps(tmp_path):
    """Of a real engine's series the query leaves out the buckets nothing reads (all but those of TTFT and
    ITL), and the scrape is the one the pod itself gives."""
    text = engine_exposition()
    with serving(text) as url:
        endpoints = {"chat-0": url}
        with running_prometheus(tmp_path, scrape_config(endpoints)) as prometheus:
            source = PrometheusSource(prometheus.url, max_age_s=0.0)
            scrapes, _ = await scraped_by_prometheus(source, endpoints)
            async with httpx.AsyncClient(timeout=10) as client:
                answer = await source._query(client, series_query())
        direct, _ = await DirectSource().scrape(NS, endpoints)
    read = ("vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket")
    buckets = {item["metric"]["__name__"] for item in answer if "le" in item["metric"]}
    assert buckets == set(read)
    for name in read:
        assert sum(item["metric"].get("__name__") == name for item in answer) == text.count(name + "{") > 10
    exported = [line for line in text.splitlines() if line and not line.startswith("#")]
    unread = [line for line in exported if "_bucket{" in line and not line.startswith(read)]
    assert len(answer) == len(exported) - len(unread) + 2 and unread      # + the pod's sample time and digest
    assert scrapes["chat-0"].histograms == direct["chat-0"].histograms
    assert scrapes["chat-0"].counters == direct["chat-0"].counters


async def test_a_query_naming_pods_answers_those_pods_alone(tmp_path, fake_engine_pods):
    """A refresh names the pods sampled since the last one; a "." in a name matches itself only."""
    _, stand_ins = fake_engine_pods(3)
    endpoints = dict(zip(("chat.1", "chatx1", "chat-2"), stand_ins.values()))
    with running_prometheus(tmp_path, scrape_config(endpoints)) as prometheus:
        source = PrometheusSource(prometheus.url, max_age_s=0.0)
        await scraped_by_prometheus(source, endpoints)
        async with httpx.AsyncClient(timeout=10) as client:
            answer = await source._query(client, series_query({"chat.1", "chat-2"}))
    assert {item["metric"]["pod"] for item in answer} == {"chat.1", "chat-2"}
    assert sum(item["metric"].get(PER_POD_LABEL) == "time" for item in answer) == 2


async def test_a_pod_whose_series_did_not_move_keeps_its_scrape_at_the_new_sample_time(tmp_path, fake_engine_pods):
    """An idle engine's series stay as they were from one sample to the next: a refresh asks the newer pods'
    digests and fetches the series of those that moved alone; the idle pod's scrape is the one a fetch
    would give."""
    _, busy = fake_engine_pods(1)
    with serving(engine_exposition()) as idle_url:
        endpoints = {"idle": idle_url, "busy": next(iter(busy.values()))}
        with running_prometheus(tmp_path, scrape_config(endpoints)) as prometheus:
            source = PrometheusSource(prometheus.url, max_age_s=0.0)
            await scraped_by_prometheus(source, endpoints)
            first = source.snapshot
            await asyncio.sleep(2.5)                        # both scraped again (every 1 s)
            asked: list[str] = []
            query = source._query

            async def spy(client, text):
                asked.append(text)
                return await query(client, text)
            source._query = spy
            second = await source.fleet()
            source.snapshot = None
            fetched = await source.fleet()                  # every pod's series, as a first refresh asks
    idle, busy_pod = (NS, "idle"), (NS, "busy")
    assert all(second.sampled[key] > first.sampled[key] for key in (idle, busy_pod))
    assert asked == [SAMPLE_TIMES_QUERY, digest_query({"idle", "busy"}), series_query({"busy"}),
                     SAMPLE_TIMES_QUERY, series_query({"idle", "busy"})]
    assert second.scrapes[idle].time > first.scrapes[idle].time
    kept, new = second.scrapes[idle], fetched.scrapes[idle]
    assert (kept.counters, kept.gauges, kept.histograms) == (new.counters, new.gauges, new.histograms)
    assert second.scrapes[busy_pod].counters != first.scrapes[busy_pod].counters


async def test_one_refresh_serves_every_service_in_an_interval(tmp_path, fake_engine_pods):
    _, endpoints = fake_engine_pods(2)
    with running_prometheus(tmp_path, scrape_config(endpoints)) as prometheus:
        await scraped_by_prometheus(PrometheusSource(prometheus.url), endpoints)
        source = PrometheusSource(prometheus.url, max_age_s=30.0)
        await asyncio.gather(*(source.scrape(NS, {pod: url}) for _ in range(10) for pod, url in endpoints.items()))
    assert source.queries == 2                                     # the sample times, then the series


async def test_prometheus_down_falls_back_to_the_pods_and_comes_back(tmp_path, fake_engine_pods):
    _, endpoints = fake_engine_pods(2)
    port = free_port()
    config = scrape_config(endpoints)
    source = PrometheusSource(f"http://127.0.0.1:{port}", max_age_s=0.0)
    with running_prometheus(tmp_path / "a", config, port=port):
        await scraped_by_prometheus(source, endpoints)
    scrapes, report = await source.scrape(NS, endpoints)
    assert report.source == "direct" and report.reason == "PrometheusUnavailable" and not report.preferred
    assert "Prometheus at" in report.message and set(scrapes) == set(endpoints)
    with running_prometheus(tmp_path / "b", config, port=port):
        _, report = await scraped_by_prometheus(source, endpoints)
    assert report.source == "prometheus"


async def test_a_pod_prometheus_lacks_is_scraped_directly(tmp_path, fake_engine_pods):
    _, endpoints = fake_engine_pods(2)
    known = dict(list(endpoints.items())[:1])
    with running_prometheus(tmp_path, scrape_config(known)) as prometheus:
        source = PrometheusSource(prometheus.url, max_age_s=0.0)
        await scraped_by_prometheus(source, known)
        scrapes, report = await source.scrape(NS, endpoints)
    assert set(scrapes) == set(endpoints)
    assert report.reason == "PrometheusStale" and report.source == "prometheus" and not report.preferred
    assert "1 of 2 pod(s)" in report.message


async def test_unreachable_and_wrong_urls_are_reported_not_raised(fake_engine_pods):
    _, endpoints = fake_engine_pods(1)
    pod_url = next(iter(endpoints.values()))          # answers HTTP, but is no Prometheus
    for url in (f"http://127.0.0.1:{free_port()}", pod_url, "http://256.0.0.1:1"):
        scrapes, report = await PrometheusSource(url, timeout=1.0).scrape(NS, endpoints)
        assert report.reason == "PrometheusUnavailable", url
        assert set(scrapes) == set(endpoints)         # the pods themselves still answered


# -- the parse, on vectors as the query API returns them -----------------------------------------------
def vector(pod: str, sampled: float, value: str = "7", namespace: str = NS) -> list[dict]:
    labels = {"namespace": namespace, "pod": pod, "inferenceservice": SERVICE, "model_name": "m"}
    return [{"metric": {"__name__": "vllm:generation_tokens_total", **labels}, "value": [sampled + 1, value]},
            {"metric": {"__name__": "vllm:num_requests_running", **labels}, "value": [sampled + 1, "2"]},
            {"metric": {**labels, PER_POD_LABEL: "time"}, "value": [sampled + 1, str(sampled)]}]


def test_samples_carry_their_own_time_on_this_process_clock():
    source = PrometheusSource("http://unused", clock=lambda: 500.0, wall=lambda: 10_000.0)
    snap = source._parse(500.0, vector("a", 9_990.0))
    scrape = snap.scrapes[(NS, "a")]
    assert scrape.time == pytest.approx(490.0)         # sampled 10 s ago
    assert scrape.counters == {"vllm:generation_tokens": 7.0}
    assert scrape.gauges == {"vllm:num_requests_running": 2.0}


def test_stale_nan_and_other_namespaces_are_left_to_direct_scrapes():
    wall = 10_000.0
    source = PrometheusSource("http://unused", stale_after_s=60.0, clock=lambda: 0.0, wall=lambda: wall)
    snap = source._parse(0.0, vector("fresh", wall - 5) + vector("old", wall - 120) + vector("nan", wall - 5, "NaN")
                         + vector("elsewhere", wall - 5, namespace="other"))
    assert (NS, "nan") in snap.dropped_nan and (NS, "nan") not in snap.scrapes
    endpoints = {p: f"http://{p}" for p in ("fresh", "old", "nan", "elsewhere", "absent")}
    fresh, missing = source._split(snap, NS, endpoints)
    assert set(fresh) == {"fresh"} and missing == ["old", "nan", "elsewhere", "absent"]
    assert "NaN samples" in source._report(snap, ["nan"], 2).message
    assert math.isfinite(fresh["fresh"].time)


def test_a_pod_sampled_no_later_keeps_its_scrape_so_a_step_sees_no_new_sample():
    """The process clock and the wall clock drift apart by microseconds between queries: a sample Prometheus
    already gave must come back with the same time, or a step would read it as new."""
    clock, wall = iter([0.0, 5.000001, 10.000002]), iter([10_000.0, 10_005.0, 10_010.0])
    source = PrometheusSource("http://unused", clock=lambda: next(clock), wall=lambda: next(wall))
    first = source.snapshot = source._parse(0.0, vector("a", 9_990.0) + vector("b", 9_990.0))
    second = source.snapshot = source._parse(5.0, vector("a", 9_990.0) + vector("b", 9_995.0, "9"))
    assert second.scrapes[(NS, "a")] is first.scrapes[(NS, "a")]
    assert second.scrapes[(NS, "b")].time > first.scrapes[(NS, "b")].time
    assert second.scrapes[(NS, "b")].counters == {"vllm:generation_tokens": 9.0}
    third = source._parse(10.0, vector("a", 9_990.0, "NaN"))        # the same sample time: kept as it was
    assert third.scrapes == {(NS, "a"): first.scrapes[(NS, "a")]}


async def test_a_refresh_fetches_only_the_pods_sampled_since_the_last_snapshot_whose_digest_moved():
    """Prometheus scrapes pods at offsets spread over its interval: a refresh asks every pod's sample time,
    then the newer pods' digests, then the series of those whose digest moved alone; an unmoved pod keeps its
    scrape at its new sample time, and with none newer nothing more is asked."""
    def per_pod(what: str, **values: float) -> list[dict]:
        return [{"metric": {"namespace": NS, "pod": pod, PER_POD_LABEL: what}, "value": [0, str(v)]}
                for pod, v in values.items()]

    first = vector("a", 9_990.0) + vector("b", 9_990.0) + per_pod("digest", a=9.0, b=9.0)
    answers = iter([per_pod("time", a=9_990.0, b=9_990.0), first,               # every pod
                    per_pod("time", a=9_990.0, b=9_995.0),                       # b newer
                    per_pod("time", b=9_995.0) + per_pod("digest", b=11.0),      # and it moved
                    vector("b", 9_995.0, "9") + per_pod("digest", b=11.0),       # so its series alone
                    per_pod("time", a=9_990.0, b=9_995.0),                       # nothing newer: nothing more
                    per_pod("time", a=10_000.0, b=9_995.0),                      # a newer
                    per_pod("time", a=10_000.0) + per_pod("digest", a=9.0)])     # unmoved: no series
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(parse_qs(request.content.decode())["query"][0])
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector",
                                                                       "result": next(answers)}})

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        source = PrometheusSource("http://prometheus", http, max_age_s=0.0, clock=lambda: 100.0,
                                  wall=lambda: 10_001.0)
        snaps = [await source.fleet() for _ in range(4)]
    assert asked == [SAMPLE_TIMES_QUERY, series_query({"a", "b"}), SAMPLE_TIMES_QUERY, digest_query({"b"}),
                     series_query({"b"}), SAMPLE_TIMES_QUERY, SAMPLE_TIMES_QUERY, digest_query({"a"})]
    assert 'pod=~"b"' in asked[4] and source.queries == 8
    first, second, third, fourth = snaps
    assert second.scrapes[(NS, "a")] is first.scrapes[(NS, "a")]
    assert second.scrapes[(NS, "b")].counters == {"vllm:generation_tokens": 9.0}
    assert second.digests == {(NS, "a"): 9.0, (NS, "b"): 11.0}
    assert third.scrapes == second.scrapes and third.sampled == second.sampled
    a_then, a_now = third.scrapes[(NS, "a")], fourth.scrapes[(NS, "a")]
    assert a_now.time == pytest.approx(a_then.time + 10) and a_now.counters == a_then.counters
    assert fourth.scrapes[(NS, "b")] is third.scrapes[(NS, "b")] and fourth.digests == second.digests


async def test_series_are_fetched_a_hundred_pods_to_a_query():
    """Decoding an answer holds up every handler: the first refresh of 250 pods asks their series in three
    queries, each naming at most `PODS_PER_QUERY` pods, every pod once."""
    pods = [f"chat-{i:03d}" for i in range(250)]
    named: list[list[str]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        query = parse_qs(request.content.decode())["query"][0]
        if query == SAMPLE_TIMES_QUERY:
            result = [{"metric": {"namespace": NS, "pod": pod, PER_POD_LABEL: "time"}, "value": [0, "9990"]}
                      for pod in pods]
        else:
            named.append(re.search(r'pod=~"([^"]*)"', query).group(1).split("|"))
            result = [item for pod in named[-1] for item in vector(pod, 9_990.0)]
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        snap = await PrometheusSource("http://prometheus", http, wall=lambda: 10_000.0).fleet()
    assert [len(names) for names in named] == [PODS_PER_QUERY, PODS_PER_QUERY, 50]
    assert sorted(pod for names in named for pod in names) == pods and len(snap.scrapes) == 250


def test_a_pod_whose_samples_were_nan_stays_dropped_until_it_is_sampled_again():
    source = PrometheusSource("http://unused", clock=lambda: 0.0, wall=lambda: 10_000.0)
    source.snapshot = source._parse(0.0, vector("a", 9_990.0, "NaN") + vector("b", 9_990.0))
    same = source._parse(5.0, [], {(NS, "a"): 9_990.0, (NS, "b"): 9_990.0})
    assert (NS, "a") in same.dropped_nan and set(same.scrapes) == {(NS, "b")}
    source.snapshot = same
    again = source._parse(10.0, vector("a", 9_995.0), {(NS, "a"): 9_995.0, (NS, "b"): 9_990.0})
    assert not again.dropped_nan and set(again.scrapes) == {(NS, "a"), (NS, "b")}
