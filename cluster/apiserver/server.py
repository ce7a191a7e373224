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

from specfleet.cluster.apiserver.auth import DEFAULT_EXPIRATION_S, Authenticator, TokenAuthority
from specfleet.cluster.apiserver.authz import Authorizer
from specfleet.cluster.apiserver.faults import Faults
from specfleet.cluster.apiserver.gc import GarbageCollector
from specfleet.cluster.apiserver.kubeconfig import ADMIN_USER, TOKEN, write_kubeconfig
from specfleet.cluster.apiserver.meta import new_uid, now
from specfleet.cluster.apiserver.persistence import StateFile
from specfleet.cluster.apiserver.rbac import bootstrap_policy
from specfleet.cluster.apiserver.registry import Registry
from specfleet.cluster.apiserver.routes import Api, status_errors
from specfleet.cluster.apiserver.service import NS_KEY, Service
from specfleet.cluster.apiserver.store import Store
from specfleet.cluster.apiserver.tls import Certificate, self_signed

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
    https: bool = True                   # also serve HTTPS (self-signed, tls.py) on its own port: `secure_url`
    local_admin: bool = True             # a request without credentials on the plain-HTTP port acts as the admin


@dataclass
class ApiServer:
    """One emulated cluster: registry, store, service, GC, authentication (`tokens`, `authenticator`),
    RBAC (`authorizer`, whose `denials` record every 403) and the HTTP front end."""
    config: ServerConfig = field(default_factory=ServerConfig)
    kubeconfig: Path | None = None

    def __post_init__(self) -> None:
        self.registry = Registry.with_builtins()
        self.store = Store(history_size=self.config.history_size)
        self.service = Service(self.registry, self.store)
        self.gc = GarbageCollector(self.service)
        self.service.on_delete.append(self.gc.schedule)
        self.tokens = TokenAuthority(self.store)
        self.state = (StateFile(Path(self.config.state_file), self.store, self.tokens)
                      if self.config.state_file else None)
        if not (self.state and self.state.load()):
            self.bootstrap()
        self.bootstrap_policy()
        self.service.restore_crds()
        if self.state:
            self.store.listeners.append(self.state.on_event)
            self.tokens.on_change.append(self.state.changed)
        self.authenticator = Authenticator(self.tokens, local_admin=self.config.local_admin)
        self.authorizer = Authorizer(self.store)
        self.faults = Faults() if self.config.faults else None
        self.port = self.config.port
        self.secure_port: int | None = None
        self.certificate: Certificate | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.ready = threading.Event()
        self.stopping: asyncio.Event | None = None
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    @property
    def url(self) -> str:
        """The plain-HTTP port (for in-process tools: without credentials they act as the admin)."""
        return f"http://{self.config.host}:{self.port}"

    @property
    def secure_url(self) -> str | None:
        """The HTTPS port (authentication and RBAC for everyone); None when `openssl` is missing."""
        return f"https://{self.config.host}:{self.secure_port}" if self.secure_port else None

    def write_kubeconfig(self, path: str | Path, token: str = TOKEN, user: str = ADMIN_USER,
                         namespace: str = "default") -> Path:
        """A kubeconfig for this server's HTTPS port (its certificate trusted), else its HTTP port."""
        if self.secure_url and self.certificate:
            return write_kubeconfig(path, self.secure_url, token, user, namespace, ca_data=self.certificate.pem)
        return write_kubeconfig(path, self.url, token, user, namespace)

    def bootstrap(self) -> None:
        for name in SYSTEM_NAMESPACES:
            self.store.put(NS_KEY, {"apiVersion": "v1", "kind": "Namespace",
                                    "metadata": {"name": name, "uid": new_uid(), "creationTimestamp": now(),
                                                 "labels": {"kubernetes.io/metadata.name": name}},
                                    "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}})

    def bootstrap_policy(self) -> None:
        """The default ClusterRoles and bindings, added on every start where missing (as kube-apiserver does)."""
        for key, obj in bootstrap_policy():
            if self.store.get(key, "", obj["metadata"]["name"]) is None:
                obj["metadata"].update(uid=new_uid(), creationTimestamp=now())
                self.store.put(key, obj)

    def issue_token(self, namespace: str, name: str, seconds: int = DEFAULT_EXPIRATION_S) -> str:
        """A bearer token of ServiceAccount `namespace/name` (what the TokenRequest API hands out)."""
        return self.tokens.issue(namespace, name, seconds)[0]

    def app(self) -> web.Application:
        middlewares = [status_errors, *([self.faults.middleware] if self.faults else []),
                       self.authenticator.middleware, self.authorizer.middleware]
        app = web.Application(middlewares=middlewares, client_max_size=64 * 1024 * 1024)
        if self.faults:
            app.add_routes(self.faults.routes())
        app.add_routes(Api(self.service, self.config.bookmark_interval, self.tokens, self.authorizer).routes())
        return app

    def bind(self, port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.config.host, port))
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
        plain = self.bind(self.config.port)
        self.port = plain.getsockname()[1]
        await web.SockSite(runner, plain, shutdown_timeout=1.0).start()
        self.certificate = self_signed(self.config.host) if self.config.https else None
        if self.certificate:
            secure = self.bind(0)
            self.secure_port = secure.getsockname()[1]
            await web.SockSite(runner, secure, shutdown_timeout=1.0,
                               ssl_context=self.certificate.server_context()).start()
        self.ready.set()
        try:
            await self.stopping.wait()
        finally:
            self.store.stop_watchers()
            await asyncio.sleep(0.05)
            if self.state:
                self.state.save()
            await runner.cleanup()
            if self.certificate:
                self.certificate.remove()

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
    """Run the emulator in a background thread; yields it with `.url`, `.secure_url`, `.kubeconfig` (the admin's,
    for the HTTPS port when there is one), `.store`, `.authorizer` and `.issue_token()`."""
    config = ServerConfig(port=port, state_file=Path(state_file) if state_file else None, **options)
    server = ApiServer(config).start()
    try:
        server.kubeconfig = server.write_kubeconfig(kubeconfig_path)
        yield server
    finally:
        server.stop()
