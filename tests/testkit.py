"""Helpers shared by the end-to-end tests (ports, polling, processes, a live engine server) (on sys.path through pytest's `pythonpath = ["tests"]`)."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

BIN = Path(sys.executable).parent   # the virtual environment's scripts (specfleet, kubectl)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(probe, timeout: float = 20.0, every: float = 0.1):
    """Poll `probe` until it returns something truthy; fail with its last value."""
    deadline, value = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            value = probe()
        except Exception as exc:  # noqa: BLE001  (not there yet)
            value = exc
        if value and not isinstance(value, Exception):
            return value
        time.sleep(every)
    raise AssertionError(f"timed out; last value: {value!r}")


def wait_server_ready(base: str, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    """Poll a server process's `/ready` until it answers 200; fail at once if the process exits."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"{base}/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("server never became ready")


def interrupt(proc: subprocess.Popen | None, timeout: float = 15.0) -> None:
    """Ctrl-C a child process (its clean shutdown) and SIGKILL it after `timeout`; nothing once it has exited."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split(")")[-1].split()[0] != "Z"


@dataclass
class LiveServer:
    """The real engine app on uvicorn in a thread, on a free 127.0.0.1 port."""

    base_url: str
    app: object
    server: object
    thread: threading.Thread

    @property
    def state(self):
        return self.app.state.server

    @property
    def engine(self):
        """The LLMEngine; read its fields only while it is idle (it belongs to the stepping thread)."""
        return self.state.engine.engine

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)

    def wait_idle(self, timeout: float = 20.0) -> None:
        """Wait until the engine has nothing running or waiting and every HTTP request has returned."""
        wait_for(lambda: not self.state.engine.busy and self.state.in_flight == 0, timeout, 0.02)


@contextlib.contextmanager
def held_after_first_token(server: LiveServer):
    """The stepping thread waits before the step after the first token until the block exits, so a request
    stays running however fast the engine is."""
    engine, gate, produced = server.engine, threading.Event(), threading.Event()
    real_step = engine.step

    def step():
        if produced.is_set():
            gate.wait(30)
        outputs = real_step()
        if any(out.new_token_ids for out in outputs):
            produced.set()
        return outputs

    engine.step = step
    try:
        yield
    finally:
        gate.set()
        del engine.step


@contextlib.contextmanager
def started(start, stop):
    """A factory for fixtures: `make(...)` calls `start(...)` and keeps what it returns; on exit every one
    of them goes to `stop`."""
    items: list = []

    def make(*args, **kwargs):
        item = start(*args, **kwargs)
        items.append(item)
        return item

    try:
        yield make
    finally:
        for item in items:
            stop(item)


def start_server(model: str, admin_token: str | None = None, limits=None, api_keys: tuple[str, ...] = (),
                 lora_modules: tuple = (), **engine_args) -> LiveServer:
    import uvicorn

    from specfleet.engine.config import EngineConfig
    from specfleet.engine.engine import LLMEngine
    from specfleet.engine.server.app import create_app
    from specfleet.engine.server.async_engine import AsyncEngine

    engine_args = {"num_kv_blocks": 128, "max_num_seqs": 32, "served_model_name": "tiny", **engine_args}
    app = create_app(AsyncEngine(LLMEngine(EngineConfig(model=model, **engine_args))), admin_token=admin_token,
                     limits=limits, api_keys=api_keys, lora_modules=lora_modules)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2,
                                           timeout_keep_alive=5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for(lambda: server.started or not thread.is_alive(), 30, 0.02)
    if not server.started:
        raise RuntimeError("uvicorn did not start")
    return LiveServer(f"http://127.0.0.1:{port}", app, server, thread)


@contextlib.contextmanager
def specfleet_up(workdir: Path, cr: Path, env: dict | None = None, args: tuple[str, ...] = ()):
    """Run `specfleet up -f CR` in `workdir` as a user would; yield (process, gateway port); Ctrl-C it after."""
    port = free_port()
    log_path = workdir / "up.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([str(BIN / "specfleet"), "up", "-f", str(cr), "--port", str(port), "--plain",
                                 *args],
                                cwd=workdir, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            yield proc, port
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    subprocess.run([str(BIN / "specfleet"), "down"], cwd=workdir, timeout=60)
            print(log_path.read_text()[-4000:])


def build_step(query_lens: list[int], context_lens: list[int], block_size: int, num_blocks: int,
               device, seed: int = 0):
    """Paged-attention metadata as the model runner lays it out (sequences ordered by query length) over
    random block tables; block 0 is left out, it doubles as table padding."""
    import torch

    from specfleet.engine.attention import build_metadata

    order = sorted(range(len(query_lens)), key=lambda i: query_lens[i])
    qlens = [query_lens[i] for i in order]
    ctx = [context_lens[i] for i in order]
    free = (torch.randperm(num_blocks - 1, generator=torch.Generator().manual_seed(seed)) + 1).tolist()
    tables = []
    for c in ctx:
        n = -(-c // block_size)
        tables.append(free[:n])
        free = free[n:]
    return build_metadata(qlens, ctx, tables, block_size, device)


async def until(probe, timeout: float = 20.0):
    """Poll `probe()` (plain or a coroutine function) until it returns something truthy (async `wait_for`)."""
    import asyncio
    import inspect

    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        value = probe()
        value = await value if inspect.isawaitable(value) else value
        if value:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s")


@contextlib.asynccontextmanager
async def local_node(workdir: Path):
    """The API emulator and a local node agent (a node with room for anything) in this event loop;
    yields an `ApiClient` to the emulator. Both stop with the block."""
    import asyncio

    from specfleet.cluster.api_client import ApiClient
    from specfleet.cluster.apiserver.kubeconfig import TOKEN
    from specfleet.cluster.apiserver.server import ApiServer, ServerConfig
    from specfleet.cluster.node_agent.agent import NodeAgent

    server = ApiServer(ServerConfig(host="127.0.0.1", port=0)).start()
    agent = NodeAgent(server.url, workdir, interval_s=0.2,
                      allocatable={"cpu": 1000, "memory": 2**30 * 1000, "pods": 110_000}, token=TOKEN)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop, shutdown_grace_s=3))
    try:
        async with ApiClient(server.url, token=TOKEN) as api:
            yield api
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
        server.stop()


def service_account_kubeconfigs(server, folder: Path) -> dict[str, Path]:
    """manifests/' Namespace, ServiceAccounts and RBAC applied to the emulator `server` (what `kubectl apply -k
    manifests/` creates), and a kubeconfig per component, {"operator": ..., "gateway": ...}, holding a token of
    the ServiceAccount its Deployment names: the operator and the gateway run with these, as on a cluster, while
    the test keeps the admin's. `server`: an `ApiServer` (the kubeconfigs then use its HTTPS port, which kubectl
    needs to send a token) or its plain URL."""
    from specfleet.cluster import service_accounts

    url, endpoint = (server, None) if isinstance(server, str) else (server.url, service_accounts.Endpoint.of(server))
    return {c: i.kubeconfig for c, i in service_accounts.component_kubeconfigs(url, folder, endpoint).items()}
