"""AsyncEngine: one background thread owns the LLMEngine and steps it; asyncio handlers talk to it.

Handlers submit commands (add, abort, `call`: an engine method such as loading a LoRA adapter) to a
thread-safe deque and wake the thread; the thread applies them between steps, steps while work remains,
and hands each step's outputs back to the event loop with one `call_soon_threadsafe` per step.
With nothing to do it sleeps on a `threading.Event`.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from specfleet.engine.cpu.tuning import release_free_memory
from specfleet.engine.engine import LLMEngine
from specfleet.engine.lora.request import LoRARequest
from specfleet.engine.outputs import RequestOutput
from specfleet.engine.sampling_params import SamplingParams

log = logging.getLogger("specfleet.engine.server")
IDLE_WAIT_S = 0.5


class EngineDead(RuntimeError):
    """The stepping thread stopped on an error; the server can no longer generate."""


@dataclass
class SubRequest:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    lora_request: LoRARequest | None = None


@dataclass
class RequestStream:
    """The outputs of one HTTP request (n sub-requests), in the order the engine produced them."""
    request_ids: list[str]
    arrival: float                               # time.monotonic() when the HTTP request came in
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    unfinished: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.unfinished = set(self.request_ids)

    @property
    def finished(self) -> bool:
        return not self.unfinished

    def index(self, request_id: str) -> int:
        return self.request_ids.index(request_id)

    async def next(self) -> RequestOutput:
        item = await self.queue.get()
        if isinstance(item, BaseException):
            raise item
        if item.finished:
            self.unfinished.discard(item.request_id)
        return item


@dataclass
class _Timing:
    arrival: float
    first_token: float | None = None
    last_token: float | None = None
    tokens: int = 0


@dataclass
class _Add:
    stream: RequestStream
    items: list[SubRequest]
    future: asyncio.Future


@dataclass
class _Call:
    fn: Callable[[LLMEngine], Any]
    future: asyncio.Future


@dataclass
class EngineSnapshot:
    """Gauges and counters copied by the stepping thread after each step, read by /metrics."""
    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    stats: dict = field(default_factory=dict)
    running_loras: tuple[str, ...] = ()          # adapters of running / waiting requests (names, sorted)
    waiting_loras: tuple[str, ...] = ()
    taken_at: float = 0.0                        # time.time()


class AsyncEngine:
    def __init__(self, engine: LLMEngine, observer: "RequestObserver | None" = None) -> None:
        self.engine = engine
        engine.detokenize_every_step = True
        self.observer = observer or RequestObserver()
        self._commands: deque = deque()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._streams: dict[str, RequestStream] = {}      # stepping thread only
        self._timings: dict[str, _Timing] = {}            # stepping thread only
        self.error: BaseException | None = None
        self.snapshot = EngineSnapshot()

    # ---- lifecycle ------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._take_snapshot()
        self._thread = threading.Thread(target=self._run, name="engine-step", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.error is None

    @property
    def busy(self) -> bool:
        return bool(self._commands) or self.snapshot.num_running + self.snapshot.num_waiting > 0

    # ---- the asyncio side -----------------------------------------------------------------
    async def add(self, items: list[SubRequest], arrival: float) -> RequestStream:
        """Queue sub-requests all-or-nothing; raises what `add_request` raises (ValueError, EngineOverloaded)."""
        if not self.alive:
            raise EngineDead("the engine is not running")
        stream = RequestStream([item.request_id for item in items], arrival)
        future = asyncio.get_running_loop().create_future()
        self._submit(_Add(stream, items, future))
        await future
        return stream

    async def call(self, fn: Callable[[LLMEngine], Any]) -> Any:
        """`fn(engine)` on the stepping thread, between steps; returns its result or raises its error."""
        if not self.alive:
            raise EngineDead("the engine is not running")
        future = asyncio.get_running_loop().create_future()
        self._submit(_Call(fn, future))
        return await future

    def abort(self, request_ids: list[str]) -> None:
        self._submit(("abort", list(request_ids)))

    def abort_all(self) -> None:
        self._submit(("abort_all",))

    def _submit(self, command) -> None:
        self._commands.append(command)
        self._wake.set()

    # ---- the stepping thread ---------------------------------------------------------------
    def _run(self) -> None:
        trimmed = False
        try:
            while not self._stop.is_set():
                self._wake.clear()
                self._apply_commands()
                if self.engine.has_unfinished():
                    self._step()
                    trimmed = False
                elif not self._wake.wait(IDLE_WAIT_S) and not trimmed:
                    release_free_memory()                 # idle: give the step's heap back to the OS
                    trimmed = True
        except BaseException as exc:          # noqa: BLE001 - report, then fail every open stream
            log.exception("engine step failed")
            self.error = exc
            self._fail_all(EngineDead(f"engine step failed: {exc!r}"))

    def _step(self) -> None:
        steps = self.engine.stats.steps
        outputs = self.engine.step()
        self._take_snapshot()
        if outputs:
            self._publish(outputs, time.monotonic())
        elif self.engine.stats.steps == steps:
            self._wake.wait(0.005)            # nothing schedulable (KV full): do not spin

    def _apply_commands(self) -> None:
        while self._commands:
            command = self._commands.popleft()
            if isinstance(command, _Add):
                self._add(command)
            elif isinstance(command, _Call):
                self._call(command)
            elif command[0] == "abort":
                self._abort(command[1])
            else:
                self._abort(list(self._streams))
        self._take_snapshot()

    def _add(self, command: _Add) -> None:
        added: list[str] = []
        try:
            for item in command.items:
                self.engine.add_request(item.request_id, item.prompt_ids, item.params, command.stream.arrival,
                                        item.lora_request)
                added.append(item.request_id)
        except BaseException as exc:           # noqa: BLE001 - handed to the waiting handler
            for request_id in added:
                self.engine.abort(request_id)
            self._resolve(command.future, exc)
            return
        for request_id in added:
            self._streams[request_id] = command.stream
            self._timings[request_id] = _Timing(command.stream.arrival)
        self._resolve(command.future, None)

    def _call(self, command: _Call) -> None:
        try:
            result = command.fn(self.engine)
        except Exception as exc:               # noqa: BLE001 - handed to the waiting handler
            self._resolve(command.future, exc)
            return
        self._resolve(command.future, None, result)

    def _abort(self, request_ids: list[str]) -> None:
        outputs = [out for out in map(self.engine.abort, request_ids) if out is not None]
        if outputs:
            self._publish(outputs, time.monotonic())

    def _publish(self, outputs: list[RequestOutput], now: float) -> None:
        batch = []
        for out in outputs:
            self._observe(out, now)
            stream = self._streams.get(out.request_id)
            if out.finished:
                self._streams.pop(out.request_id, None)
            if stream is not None:
                batch.append((stream, out))
        if batch:
            self._loop.call_soon_threadsafe(_deliver, batch)

    def _observe(self, out: RequestOutput, now: float) -> None:
        timing = self._timings.get(out.request_id)
        if timing is None:
            return
        n = len(out.new_token_ids)
        if n:
            timing.tokens += n
            if timing.last_token is None:
                self.observer.first_token(now - timing.arrival)
                if out.first_scheduled_time is not None:
                    self.observer.queued(out.first_scheduled_time - timing.arrival, now - out.first_scheduled_time)
                timing.first_token = now
                n -= 1
            else:
                self.observer.inter_token((now - timing.last_token) / n, n)
            timing.last_token = now
        if out.finished:
            self._timings.pop(out.request_id, None)
            self.observer.finished(out.finish_reason, now - timing.arrival)
            if timing.first_token is not None and out.finish_reason != "abort":
                tpot = (now - timing.first_token) / (timing.tokens - 1) if timing.tokens > 1 else 0.0
                self.observer.served(timing.first_token - timing.arrival, tpot)

    def _resolve(self, future: asyncio.Future, exc: BaseException | None, result: Any = None) -> None:
        def settle() -> None:
            if future.done():
                return
            future.set_exception(exc) if exc is not None else future.set_result(result)
        self._loop.call_soon_threadsafe(settle)

    def _fail_all(self, exc: BaseException) -> None:
        streams = {id(s): s for s in self._streams.values()}.values()
        self._streams.clear()
        for command in list(self._commands):
            if isinstance(command, (_Add, _Call)):
                self._resolve(command.future, exc)
        if streams and self._loop is not None:
            self._loop.call_soon_threadsafe(_deliver, [(s, exc) for s in streams])

    def _take_snapshot(self) -> None:
        e = self.engine
        stats = dict(vars(e.stats))
        stats["spec_accepted_by_position"] = list(e.stats.spec_accepted_by_position)
        stats["ngram_proposed_by_depth"] = list(e.stats.ngram_proposed_by_depth)
        running, waiting = self._lora_names(e) if getattr(e, "lora", None) is not None else ((), ())
        self.snapshot = EngineSnapshot(e.num_running, e.num_waiting, e.kv_cache_usage, stats, running, waiting,
                                       time.time())

    @staticmethod
    def _lora_names(e: LLMEngine) -> tuple[tuple[str, ...], tuple[str, ...]]:
        names = e.lora_names()
        running = {names[s.lora_id] for s in e.scheduler.running if s.lora_id in names}
        waiting = {names[s.lora_id] for s in e.scheduler.waiting if s.lora_id in names}
        return tuple(sorted(running)), tuple(sorted(waiting))


def _deliver(batch: list[tuple[RequestStream, RequestOutput | BaseException]]) -> None:
    for stream, item in batch:
        stream.queue.put_nowait(item)


class RequestObserver:
    """Per-request latency hooks, called on the stepping thread (metrics implement them)."""

    def first_token(self, ttft_s: float) -> None: ...

    def queued(self, queue_s: float, prefill_s: float) -> None:
        """A first token's TTFT in two: from the HTTP handler to the step that first took the request, and
        from there to the token."""

    def inter_token(self, itl_s: float, count: int) -> None: ...

    def finished(self, finish_reason: str | None, e2e_s: float) -> None: ...

    def served(self, ttft_s: float, tpot_s: float) -> None:
        """A request that produced output and was not aborted: its TTFT and mean time per output token."""


