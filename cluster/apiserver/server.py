"""The emulator's lifecycle: an aiohttp app on its own event loop, in the foreground (CLI) or in a background
thread (`running_apiserver`, for tests), with optional persistence and the garbage collector."""
from __future__ import annotations

import asyncio
import logging
import socket
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from aiohttp import web

from specfleet.cluster.apiserver.faults import Faults
from specfleet.cluster.apiserver.gc import GarbageCollector
from specfleet.cluster.apiserver.kubeconfig import write_kubeconfig
from specfleet.cluster.apiserver.meta import new_uid, now
from specfleet.cluster.apiserver.persistence import StateFile
from specfleet.cluster.apiserver.registry import Registry
from specfleet.cluster.apiserver.routes import Api, status_errors
from specfleet.cluster.apiserver.service import NS_KEY, Service
from specfleet.cluster.apiserver.store import Store

log = logging.getLogger(__name__)
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 0
    state_file: Path | None = None
    history_size: int = 50_000
    bookmark_interval: float = 10.0
    faults: bool = False                 # tests only: the /_faults injection endpoint (faults.py)


@dataclass
class ApiServer:
    """One emulated cluster: registry, store, service, GC and the HTTP front end."""
    config: ServerConfig = field(default_factory=ServerConfig)
    kubeconfig: Path | None = None

    def __post_init__(self) -> None:
        self.registry = Registry.with_builtins()
        self.store = Store(history_size=self.config.history_size)
        self.service = Service(self.registry, self.store)
        self.gc = GarbageCollector(self.service)
        self.service.on_delete.append(self.gc.schedule)
        self.state = StateFile(Path(self.config.state_file), self.store) if self.config.state_file else None
        if not (self.state and self.state.load()):
            self.bootstrap()
        self.service.restore_crds()
        if self.state:
            self.store.listeners.append(self.state.on_event)
        self.faults = Faults() if self.config.faults else None
        self.port = self.config.port
        self.loop: asyncio.AbstractEventLoop | None = None
        self.ready = threading.Event()
        self.stopping: asyncio.Event | None = None
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    def bootstrap(self) -> None:
        for name in SYSTEM_NAMESPACES:
            self.store.put(NS_KEY, {"apiVersion": "v1", "kind": "Namespace",
                                    "metadata": {"name": name, "uid": new_uid(), "creationTimestamp": now(),
                                                 "labels": {"kubernetes.io/metadata.name": name}},
                                    "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}})

    def app(self) -> web.Application:
        middlewares = [status_errors] + ([self.faults.middleware] if self.faults else [])
        app = web.Application(middlewares=middlewares, client_max_size=64 * 1024 * 1024)
        if self.faults:
            app.add_routes(self.faults.routes())
        app.add_routes(Api(self.service, self.config.bookmark_interval).routes())
        return app

    def bind(self) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.config.host, self.config.port))
        self.port = sock.getsockname()[1]
        return sock

    async def serve(self) -> None:
        """Serve until `stop()`; then end the watches, save the state and close."""
        self.loop = asyncio.get_running_loop()
        self.gc.loop = self.loop
        if self.state:
            self.state.loop = self.loop
        self.stopping = asyncio.Event()
        runner = web.AppRunner(self.app(), access_log=None)
        await runner.setup()
        await web.SockSite(runner, self.bind(), shutdown_timeout=1.0).start()
        self.ready.set()
        try:
            await self.stopping.wait()
        finally:
            self.store.stop_watchers()
            await asyncio.sleep(0.05)
            if self.state:
                self.state.save()
            await runner.cleanup()

    # ------------------------------------------------------------ background thread
    def start(self) -> "ApiServer":
        self.thread = threading.Thread(target=self._run, name="specfleet-apiserver", daemon=True)
        self.thread.start()
        if not self.ready.wait(30) or self.error:
            raise RuntimeError(f"the API emulator did not start: {self.error}")
        return self

    def _run(self) -> None:
        try:
            asyncio.run(self.serve())
        except BaseException as exc:                       # reported by start()
            self.error = exc
            self.ready.set()

    def stop(self) -> None:
        if self.loop is not None and self.stopping is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.stopping.set)
        if self.thread is not None:
            self.thread.join(timeout=10)


@contextmanager
def running_apiserver(kubeconfig_path: str | Path, port: int = 0, state_file: str | Path | None = None,
                      **options) -> Iterator[ApiServer]:
    """Run the emulator in a background thread; yields it with `.url`, `.kubeconfig` and `.store`."""
    config = ServerConfig(port=port, state_file=Path(state_file) if state_file else None, **options)
    server = ApiServer(config).start()
    try:
        server.kubeconfig = write_kubeconfig(kubeconfig_path, server.url)
        yield server
    finally:
        server.stop()
