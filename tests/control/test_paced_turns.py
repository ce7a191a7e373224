"""Turns at the samples' pace (`control/scheduler.py`, `ServiceControl.news`, `PrometheusSource.news`): a
turn that would read no newer sample is taken in place (no task, no body decoded), an interval waiting for
its pods' samples is tried again a detection period later, and a detection that finds them just before the
interval takes the interval, which stays on its grid."""
from __future__ import annotations

import asyncio
import time

from specfleet.operator.control import loop, scheduler
from specfleet.operator.control.discovery import EngineView
from specfleet.operator.control.sources import DirectSource, PrometheusSource, Snapshot
from specfleet.operator.control.window import Scrape

from tests.control.scheduler_kit import FakeControl, run_for, serving_pod


class Paced(FakeControl):
    """A control whose `news` a test scripts: `answer(interval, since_start)`; records when each step ran."""

    def __init__(self, name, answer, interval_s, detect_s):
        super().__init__(name)
        self.config = loop.LoopConfig(interval_s=interval_s, detect_interval_s=detect_s)
        self.answer, self.start, self.times = answer, time.monotonic(), []

    def news(self, pods, interval):
        return self.answer(interval, time.monotonic() - self.start)

    async def interval(self, body, pods, replicas, when):
        self.times.append(time.monotonic() - self.start)
        return await super().interval(body, pods, replicas, when)


def run(control, seconds):
    view, decoded = EngineView(), []
    view.pod_changed(serving_pod(control.name))

    async def publish(body, outcome):
        pass

    def body():
        decoded.append(1)
        return {"metadata": {"name": control.name}}

    async def main():
        sched = scheduler.ControlScheduler(view, publish)
        control.start = time.monotonic()
        sched.track(("ns", control.name), control, body)
        await run_for(seconds, sched)
    asyncio.run(main())
    return len(decoded)


def test_a_detection_that_would_read_nothing_new_is_taken_in_place():
    control = Paced("quiet", lambda interval, t: None if interval else False, interval_s=0.2, detect_s=0.05)
    decoded = run(control, 0.9)
    assert control.steps.count("detect") == 0 and control.steps.count("interval") >= 3
    assert decoded == len(control.steps)                      # a body is decoded for the intervals alone


def test_an_interval_waiting_for_its_samples_is_tried_again_a_detection_period_later():
    """The samples appear 0.1 s after the first interval was due: it runs then, not a whole interval later."""
    first_due = []

    def answer(interval, t):
        if interval and not first_due:
            first_due.append(t)
        return None if first_due and t >= first_due[0] + 0.1 else (False if interval else None)

    control = Paced("waits", answer, interval_s=1.0, detect_s=0.15)
    run(control, 1.6)
    assert control.times, "the interval never ran"
    assert control.times[0] - first_due[0] < 0.4, (first_due, control.times)


def test_a_detection_that_finds_the_next_samples_just_before_the_interval_takes_it_on_its_grid():
    """A sample for each pod at every look: the detection in the last detection period before an interval
    runs the interval (one detection between intervals, not two); the next interval stays one interval
    after the one due, not after the early run, so the intervals keep their grid."""
    control = Paced("early", lambda interval, t: True, interval_s=0.5, detect_s=0.2)
    run(control, 2.4)
    first, intervals = control.times[0], control.times
    assert len(intervals) >= 4, intervals
    for i, t in enumerate(intervals):                           # the first is on time: no turn came before it
        assert first + 0.5 * i - 0.2 - 0.03 <= t <= first + 0.5 * i + 0.1, intervals
    assert any(t < first + 0.5 * i - 0.02 for i, t in enumerate(intervals)), intervals    # some ran early
    assert control.steps.count("detect") < 2 * (len(intervals) - 1), control.steps


def snapshot_source(sampled: dict[str, float], age_s: float = 0.0, wall: float = 1000.0):
    source = PrometheusSource("http://prometheus:9090", clock=lambda: 50.0, wall=lambda: wall)
    source.snapshot = Snapshot(50.0 - age_s, {("ns", pod): Scrape(t) for pod, t in sampled.items()},
                               {("ns", pod): t for pod, t in sampled.items()}, frozenset())
    return source


def test_prometheus_news_says_all_none_or_unsure_without_io():
    endpoints = {"a": "http://a", "b": "http://b"}
    seen = {"a": Scrape(990.0), "b": Scrape(990.0)}
    source = snapshot_source({"a": 995.0, "b": 996.0})
    assert source.news("ns", endpoints, seen) is True
    assert snapshot_source({"a": 990.0, "b": 990.0}).news("ns", endpoints, seen) is False
    assert snapshot_source({"a": 995.0, "b": 990.0}).news("ns", endpoints, seen) is None     # some new, some not
    assert snapshot_source({"a": 995.0, "b": 996.0}, age_s=5.0).news("ns", endpoints, seen) is None  # refresh due
    assert snapshot_source({"a": 990.0}).news("ns", endpoints, seen) is None                   # b not in Prometheus
    assert source.news("ns", endpoints, {"a": Scrape(990.0)}) is None                          # b never read
    stale = snapshot_source({"a": 990.0, "b": 990.0}, wall=990.0 + source.stale_after_s + 1)
    assert stale.news("ns", endpoints, seen) is None              # scraped directly: a new sample
    assert source.news("ns", {}, seen) is None
    assert DirectSource().news("ns", endpoints, seen) is None
