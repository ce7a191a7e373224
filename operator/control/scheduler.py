"""One scheduler for the control loops of all InferenceServices.

Each tracked service has its `ServiceControl` (kept in the service's kopf `memo`) and a due time; one
asyncio task sleeps until the earliest one, steps the services that are due (an interval every
`interval_s`; surge detection every `detect_interval_s` in between, only while the service has pods
to scrape) and schedules them again. A turn with nothing to do is taken in place, for a look at the
`EngineView` and a heap push: a service with no pods (and nothing scraped before) is idle, and a turn that
would find no sample newer than the last it read ends before it starts. Where samples come at their own
pace (Prometheus scrapes each pod once per 15 s), the interval follows them: it is taken up to a
detection period early by the detection that finds each pod's next sample, or tried again a detection
period later while they are not there yet, so each sample is read once. A service is never stepped twice
at once; different services step concurrently, at most `concurrency` at a time.

Each service's latest body is kept as `StoredBody`: compact JSON of the fields a step reads, decoded only
when the service steps. Holding the watch's decoded body instead cost some 20 KiB of Python objects per
service (most of the operator's memory at 5,000 services), for bodies an idle service never reads.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import logging
import math
import random
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from specfleet.operator import status
from specfleet.operator.control import discovery
from specfleet.operator.control.discovery import EngineView
from specfleet.operator.control.runner import ControlOutcome, ServiceControl, now_iso

log = logging.getLogger("specfleet.operator.control")
Key = tuple[str, str]                                   # (namespace, name)
Publish = Callable[[dict, ControlOutcome], Awaitable[None]]
AfterInterval = Callable[[dict, list, ControlOutcome | None], Awaitable[ControlOutcome | None]]


# The scheduler wakes this long after the earliest turn is due, and steps every turn due by then: with
# 5,000 services' turns spread over an interval, waking for each alone cost an idle operator a timer and a
# cancelled task per turn. A turn starts late by at most this (or a tenth of the shortest step period
# tracked, where that is less), never early.
WAKE_SLACK_S = 0.05

STORED_METADATA = ("name", "namespace", "uid", "generation", "resourceVersion", "labels")


@dataclass(frozen=True, slots=True)
class StoredBody:
    """A service's body as the scheduler keeps it: compact JSON of apiVersion, kind, spec, status and the
    metadata a step or its status writer reads (`STORED_METADATA`; not the annotations kopf keeps its
    state in, nor managedFields). Calling it gives the body as plain dicts."""

    data: bytes

    @classmethod
    def of(cls, plain: dict) -> "StoredBody":
        meta = plain.get("metadata") or {}
        kept = {**plain, "metadata": {k: meta[k] for k in STORED_METADATA if k in meta}}
        return cls(json.dumps(kept, separators=(",", ":")).encode())

    def __call__(self) -> dict:
        return json.loads(self.data)


@dataclass(slots=True)
class _Tracked:
    control: ServiceControl
    body: Callable[[], dict]        # the service's latest body, as plain dicts (a `StoredBody`)
    next_interval: float
    due: float                      # the next step (interval or detection)
    early: bool = False             # the next step is the interval, a detection period early at most


def _advance(tracked: _Tracked, now: float) -> None:
    """The next interval one interval after this one was due (turns start up to `WAKE_SLACK_S` late, which
    must not add up), or after now if that has passed too."""
    interval_s = tracked.control.config.interval_s
    due = tracked.next_interval + interval_s
    tracked.next_interval = due if due > now else now + interval_s


def _retry(tracked: _Tracked, now: float) -> None:
    """An interval that waits for its pods' next samples is tried again a detection period later (a third
    of an interval without detection): the intervals then follow the pace the samples arrive at."""
    config = tracked.control.config
    tracked.next_interval = now + (config.detect_interval_s or config.interval_s / 3)


class ControlScheduler:
    def __init__(self, view: EngineView, publish: Publish, clock: Callable[[], float] = time.monotonic,
                 concurrency: int = 32, after_interval: AfterInterval | None = None):
        """`after_interval(body, pods, outcome)`: runs after each interval step, its result published in
        the step's place (the LoRA adapter sync, `adapter_sync.py`)."""
        self.view, self.publish, self.clock = view, publish, clock
        self.after_interval = after_interval
        self._tracked: dict[Key, _Tracked] = {}
        self._heap: list[tuple[float, int, Key]] = []
        self._order = itertools.count()
        self._limit = asyncio.Semaphore(concurrency)
        self._changed = asyncio.Event()
        self._running: set[asyncio.Task] = set()
        self.wake_slack_s = WAKE_SLACK_S
        self._wake_at = math.inf             # when `run` wakes next (inf before its first wait: any push wakes it)

    def track(self, key: Key, control: ServiceControl, body: Callable[[], dict]) -> None:
        """Start controlling a service, or give it a newer body; its first interval comes at a random point
        of the second half of one (services created together do not step in the same instant forever)."""
        tracked = self._tracked.get(key)
        if tracked is not None:
            tracked.body = body
            return
        self.wake_slack_s = min(self.wake_slack_s, control.config.interval_s / 10, control.config.detect_interval_s / 10)
        first = self.clock() + control.config.interval_s * random.uniform(0.5, 1.0)
        self._tracked[key] = _Tracked(control, body, first, first)
        self._push(key, first)

    def forget(self, key: Key) -> None:
        self._tracked.pop(key, None)

    def __len__(self) -> int:
        return len(self._tracked)

    async def run(self) -> None:
        """Step due services until cancelled."""
        while True:
            now = self.clock()
            while self._heap and self._heap[0][0] <= now:
                due, _, key = heapq.heappop(self._heap)
                tracked = self._tracked.get(key)
                # else forgotten or rescheduled; a turn with nothing to do needs no task
                if tracked is not None and tracked.due == due and not self._quiet_turn(key, tracked):
                    self._start(key, tracked)
            self._wake_at = self._heap[0][0] + self.wake_slack_s if self._heap else math.inf
            wait = self._wake_at - now if self._heap else None
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), wait)
            except asyncio.TimeoutError:
                pass

    def _quiet_turn(self, key: Key, tracked: _Tracked) -> bool:
        """A turn with nothing to do, taken in place (no task, no body decoded); False if the turn has work.
        Nothing to do: an idle service's turn (most of a large fleet), or one that would find no sample
        newer than the last it read (`ServiceControl.news`), where an interval is tried again soon
        (`_retry`). A detection that finds each pod's next sample within a detection period of the
        interval takes the interval instead: where samples come at their own pace (Prometheus's), the
        intervals follow it, and each sample is read once, not by a detection and again by the interval."""
        pods, control, now = self.view.pods(*key), tracked.control, self.clock()
        interval = now >= tracked.next_interval - 1e-3
        if control.idle(pods):
            if interval:
                _advance(tracked, now)
        elif interval:
            if control.news(pods, interval=True) is not False:
                return False
            _retry(tracked, now)
        elif tracked.next_interval - now <= control.config.detect_interval_s and control.news(pods, interval=True):
            tracked.early = True
            return False
        elif control.news(pods, interval=False) is not False:
            return False
        tracked.due = self._next(control, tracked, pods)
        self._push(key, tracked.due)
        return True

    def _start(self, key: Key, tracked: _Tracked) -> None:
        task = asyncio.create_task(self._step(key, tracked))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _step(self, key: Key, tracked: _Tracked) -> None:
        control, now, pods = tracked.control, self.clock(), []
        interval, tracked.early = tracked.early or now >= tracked.next_interval - 1e-3, False
        if interval:
            _advance(tracked, now)
        try:
            pods = self.view.pods(*key)
            if not control.idle(pods):
                async with self._limit:
                    await self._run_step(control, tracked, pods, interval)
        finally:                    # whatever happened, the service keeps its turn
            if interval and control.awaiting:
                _retry(tracked, self.clock())
            if self._tracked.get(key) is tracked:
                tracked.due = self._next(control, tracked, pods)
                self._push(key, tracked.due)

    async def _run_step(self, control: ServiceControl, tracked: _Tracked, pods, interval: bool) -> None:
        try:
            plain = tracked.body()
            step = control.interval if interval else control.detect
            outcome = await step(plain, pods, self.view.replicas(control.namespace, control.name), now_iso())
            if interval and self.after_interval is not None:
                outcome = await self.after_interval(plain, pods, outcome)
            if outcome is not None and (outcome.events or self._writes(plain, outcome)):
                await self.publish(plain, outcome)
        except Exception as exc:  # noqa: BLE001  (the next interval re-reads everything)
            if control.kube.transient(exc):
                log.warning("control of %s/%s skipped: API server: %s", control.namespace, control.name, exc)
            else:
                log.exception("control of %s/%s failed", control.namespace, control.name)

    @staticmethod
    def _writes(plain: dict, outcome: ControlOutcome) -> bool:
        """Whether publishing would write status (else, without Events, it is skipped here: no thread hop)."""
        return bool(outcome.status) and status.changes(plain.get("status") or {}, outcome.status)

    def _next(self, control: ServiceControl, tracked: _Tracked, pods) -> float:
        """The interval, or sooner a detection while there are pods to scrape."""
        detect = control.config.detect_interval_s
        if detect and discovery.endpoints(pods):
            return min(tracked.next_interval, self.clock() + detect)
        return tracked.next_interval

    def _push(self, key: Key, due: float) -> None:
        """Queue a turn; wake the scheduler only if it would otherwise start the turn late (each wake costs
        an idle fleet a timer and a task, and steps end hundreds of times a second)."""
        heapq.heappush(self._heap, (due, next(self._order), key))
        if due + self.wake_slack_s < self._wake_at:
            self._changed.set()
