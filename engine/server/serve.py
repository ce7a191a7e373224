"""Run the server under uvicorn, with the drain Kubernetes rolling updates need.

On SIGTERM: `/ready` turns 503, new generation requests get 503, in-flight ones run to completion
(bounded by `drain_timeout_s`, after which they are aborted), then uvicorn shuts down and the process
exits 0. A second SIGTERM, or SIGINT, stops at once.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import threading
from typing import Callable, TypeVar

import uvicorn

from specfleet.engine.config import EngineConfig
from specfleet.engine.stats import StepLog

log = logging.getLogger("specfleet.engine.server")
T = TypeVar("T")


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state, drain_timeout_s: float) -> None:
        super().__init__(config)
        self.state = state
        self.drain_timeout_s = drain_timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task | None = None

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame) -> None:
        if sig == signal.SIGTERM and self._drain_task is None and self._loop is not None and self.started:
            log.info("SIGTERM: draining for up to %.0f s", self.drain_timeout_s)
            self._loop.call_soon_threadsafe(self._start_drain)
            return
        super().handle_exit(sig, frame)

    def _start_drain(self) -> None:
        if self._drain_task is None:
            self._drain_task = self._loop.create_task(self._drain())

    async def _drain(self) -> None:
        await self.state.drain(self.drain_timeout_s)
        log.info("drained; shutting down")
        self.should_exit = True


def build_app(config: EngineConfig, admin_token_file: str | None = None, limits=None,
              api_keys: tuple[str, ...] = (), log_steps: str | None = None, lora_modules: tuple = ()):
    """Load the model and the start-up LoRA adapters and build the app (returns the app and its shared
    ServerState); with `log_steps`, every engine step is appended to that file as a JSON line
    (`stats.StepLog`). A bad adapter raises `lora_api.LoRAModuleError`."""
    from specfleet.engine.engine import LLMEngine
    from specfleet.engine.server.app import create_app
    from specfleet.engine.server.async_engine import AsyncEngine
    from specfleet.engine.server.auth import read_token_file

    token = read_token_file(admin_token_file) if admin_token_file else None

    def build():
        engine = LLMEngine(config)
        if log_steps:
            engine.step_listeners.append(StepLog(log_steps))
        return create_app(AsyncEngine(engine), admin_token=token, limits=limits, api_keys=api_keys,
                          lora_modules=tuple(lora_modules))

    app = load_off_the_main_thread(build)       # adapters too: reading them runs parallel torch ops
    return app, app.state.server


def load_off_the_main_thread(build: Callable[[], T]) -> T:
    """`build()` in a thread that then ends, returning its result or raising its error.

    OpenMP keeps a worker pool for each thread that ever ran a parallel region, and loading a model runs
    many. A pool left on the main thread (which lives on, serving HTTP) counts against the cores, so
    libgomp throttles every worker's spin-wait to ~1,000 iterations: the stepping thread's workers then
    sleep and wake at each of a step's hundreds of parallel regions (measured on 2 cores: a SmolLM2
    decode step 45-50% slower, 22,900 voluntary context switches instead of ~30). A thread that ends
    takes its pool with it."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = build()
        except BaseException as exc:          # re-raised on the calling thread
            box["error"] = exc

    thread = threading.Thread(target=run, name="engine-load")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def run_server(config: EngineConfig, host: str = "0.0.0.0", port: int = 8000, admin_token_file: str | None = None,
               drain_timeout_s: float = 30.0, log_level: str = "info", limits=None,
               api_keys: tuple[str, ...] = (), log_steps: str | None = None, lora_modules: tuple = ()) -> None:
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app, state = build_app(config, admin_token_file, limits, api_keys, log_steps, lora_modules)
    if not api_keys:
        log.warning("no API key configured: the OpenAI endpoints are open to anyone who reaches %s:%d", host, port)
    if state.access.admin_token is None:
        log.info("no admin token configured: the admin API is off")
    uv_config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5,
                               timeout_keep_alive=5, access_log=log_level == "debug")
    DrainingServer(uv_config, state, drain_timeout_s).run()
