"""`specfleet up`: a whole fleet on one machine (docs/fleet.md).

    API emulator (thread) <- CRD, manifests/' Namespace, ServiceAccounts and RBAC, InferenceService(s)
    operator  (subprocess: manifests/operator.yaml's command line, its ServiceAccount's token)
                          -> Deployment, Service, PDB, admin Secret
    node agent (asyncio, admin credentials) -> ReplicaSets, Pods (scheduled by their requests, each on its
                          own 127.0.0.N), engine processes (`specfleet engine serve`), statuses
    gateway   (subprocess: manifests/gateway/deployment.yaml's command line, its ServiceAccount's token,
                          --port) -> OpenAI API over the ready pods
    Prometheus (subprocess, when on PATH) <- the pods the PodMonitors select (`prometheus.py`); the
                          operator's control loop reads it, the shipped rules run in it
    load      (asyncio, --load PROFILE) -> requests through the gateway

The two command lines are the manifests' own with only a laptop's substitutions (`manifest_commands.py`);
their credentials are tokens of the manifests' ServiceAccounts under the manifests' RBAC
(`service_accounts.py`). Everything lives under the state folder (`.specfleet/`): `kubeconfig` (admin,
for the user), `operator.kubeconfig` and `gateway.kubeconfig` (0600), `fleet.json` (pids, URLs), `lock`
(held while up runs), `pids/` (operator, gateway, Prometheus and engine processes), `logs/`, `pods/`
(volumes), `prometheus/` (its config, targets, rules and data).
Preflight checks (already running, port, CR file, plan, model) fail with one line before anything starts.
However `up` ends (Ctrl-C, SIGTERM, SIGHUP, its stdout closed) it stops every child; children it cannot
stop (it was SIGKILLed) die with it (`children.py`).
"""
from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import select
import signal
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib.abc import Traversable
from pathlib import Path

import yaml

from specfleet.cluster import manifest_commands, prometheus, resources, service_accounts
from specfleet.cluster.apiserver.kubeconfig import ADMIN_USER, TOKEN   # `up` and its user administer the cluster
from specfleet.cluster.children import die_with_parent, kill_group
from specfleet.cluster.prometheus import LocalPrometheus

KIND = "InferenceService"
APPLYABLE = {"Namespace", "Secret", "ConfigMap", KIND}
TEARDOWN_GRACE_S = 10.0
OPERATOR_GRACE_S = 5.0
GATEWAY_START_S = 60.0      # the gateway subprocess answers /health within this (imports on a busy machine)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# name -> [(seconds, concurrent clients)], repeated
LOAD_PROFILES = {
    "ramp": [(20, 1), (90, 8), (60, 1)],
    "spike": [(30, 1), (30, 16)],
    "steady": [(60, 2)],
}
LOAD_PROMPTS = ["Count from one to twenty: one, two, three, four, five, six, seven, eight,",
                "Repeat after me three times: the quick brown fox jumps over the lazy dog.",
                "List the days of the week, then list them again in the same order.",
                "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):"]


class FleetError(Exception):
    """A problem reported as one line, with a non-zero exit."""


@dataclass
class FleetConfig:
    files: list[Path] = field(default_factory=list)
    port: int = 8000
    state_dir: Path = Path(".specfleet")
    load: str | None = None
    live: bool | None = None          # None: a live table when stdout is a terminal
    host: str = "127.0.0.1"
    node_cpus: float | None = None    # the local node's allocatable; None: this machine's
    node_memory: str | None = None
    api_key_files: list[Path] = field(default_factory=list)   # lock the gateway: keys, one per line
    prometheus: bool | None = None    # run a Prometheus for the control loop; None: when the binary is on PATH


# -- state folder ---------------------------------------------------------------------------------------
def read_info(state_dir: Path) -> dict | None:
    try:
        return json.loads((state_dir / "fleet.json").read_text())
    except (OSError, ValueError):
        return None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:   # a zombie is not alive
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def take_lock(state_dir: Path):
    """Hold `state_dir/lock` for the life of this process; FleetError when another `up` holds it."""
    state_dir.mkdir(parents=True, exist_ok=True)
    handle = open(state_dir / "lock", "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        info = read_info(state_dir) or {}
        where = f" (pid {info.get('pid')}, gateway {info.get('gateway')})" if info else ""
        raise FleetError(f"specfleet is already running in {state_dir}{where}; stop it with `specfleet down`")
    return handle


def check_port(host: str, port: int) -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # TIME_WAIT leftovers are not "in use"
        try:
            s.bind((host, port))
        except OSError:
            raise FleetError(f"port {port} is already in use on {host}; free it or pick another with --port")


# -- manifests ------------------------------------------------------------------------------------------
def load_manifests(files: list[Path | Traversable]) -> list[dict]:
    docs: list[dict] = []
    for file in files:
        try:
            loaded = list(yaml.safe_load_all(file.read_text()))
        except FileNotFoundError:
            raise FleetError(f"CR file not found: {file}")
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise FleetError(f"broken CR file {file}:{where}: {problem}")
        for doc in loaded:
            if doc is None:
                continue
            if not isinstance(doc, dict) or not isinstance(doc.get("metadata"), dict) or "kind" not in doc:
                raise FleetError(f"broken CR file {file}: every document needs kind and metadata")
            if doc["kind"] not in APPLYABLE:
                raise FleetError(f"{file}: {doc['kind']} is not supported by `specfleet up` "
                                 f"(only {', '.join(sorted(APPLYABLE))})")
            doc["metadata"].setdefault("namespace", "default") if doc["kind"] != "Namespace" else None
            docs.append(doc)
    if not any(d["kind"] == KIND for d in docs):
        raise FleetError(f"no {KIND} in {', '.join(map(str, files))}")
    return docs


def check_service(doc: dict) -> None:
    """Spec, plan and model of one InferenceService, each failure one line."""
    from specfleet.operator import api, catalogs, model_folder, planner

    name = doc["metadata"].get("name", "unnamed")
    try:
        spec = api.parse_spec(doc.get("spec") or {})
    except api.SpecError as exc:
        raise FleetError(f"invalid {KIND} {name}: {exc}")
    check_model(name, spec.model.source)
    spec = model_folder.with_folder_architecture(spec, catalogs.models())   # as the operator plans it
    result = planner.plan(spec, catalogs.gpus(), catalogs.models(), catalogs.profiles())
    if isinstance(result, planner.Infeasible):
        raise FleetError(f"{KIND} {name} is infeasible ({result.reason}): {result.message}")


def check_model(name: str, source: str) -> None:
    import importlib.util

    from specfleet.engine import builtin
    from specfleet.operator.api import parse_source

    src = parse_source(source)
    if src.kind == "builtin":
        if src.location not in builtin.BUILTIN_MODELS:
            raise FleetError(f"model not found for {name}: no built-in model {src.location!r}")
        package = builtin.BUILTIN_MODELS[src.location][0]
        cached = (builtin.cache_dir() / src.location / "config.json").is_file()
        if not cached and importlib.util.find_spec(package) is None:
            raise FleetError(f"model not found for {name}: {source} needs the PyPI package "
                             f"{package.replace('_', '-')!r}")
    elif src.kind in ("hostpath", "image"):
        if not (Path(src.location) / "config.json").is_file():
            raise FleetError(f"model not found for {name}: {source} (no config.json in {src.location})")
    elif src.kind == "pvc":
        raise FleetError(f"{name}: pvc:// models need a real cluster; use hostpath:/path with `specfleet up`")


def gateway_keys(config: FleetConfig):
    """The gateway's API keys from `--api-key-file` (none: the door is open)."""
    from specfleet.cluster.gateway.keys import ApiKeys

    try:
        return ApiKeys.from_flags([str(p) for p in config.api_key_files], None)
    except (OSError, ValueError) as exc:
        raise FleetError(f"--api-key-file: {exc}")


def preflight(config: FleetConfig):
    """Everything that can fail before a process starts; returns (lock handle, manifests)."""
    lock = take_lock(config.state_dir)
    try:
        check_port(config.host, config.port)
        if config.load is not None and config.load not in LOAD_PROFILES:
            raise FleetError(f"unknown load profile {config.load!r} (one of {', '.join(LOAD_PROFILES)})")
        docs = load_manifests([Path(f) for f in config.files] or [resources.default_cr()])
        for doc in docs:
            if doc["kind"] == KIND:
                check_service(doc)
        node_allocatable(config)
        gateway_keys(config)
        try:
            resources.crd_text()
        except OSError as exc:
            raise FleetError(f"the CRD is missing from the installed package: {exc}")
    except BaseException:
        lock.close()
        raise
    return lock, docs


# -- the running fleet ------------------------------------------------------------------------------------
def node_allocatable(config: FleetConfig) -> dict[str, int]:
    """The local node's allocatable resources: this machine's, or what --node-cpus/--node-memory say."""
    from specfleet.cluster.node_agent import scheduling

    allocatable = scheduling.machine_allocatable()
    try:
        if config.node_cpus is not None:
            allocatable["cpu"] = scheduling.milli(config.node_cpus)
        if config.node_memory is not None:
            allocatable["memory"] = scheduling.milli(config.node_memory)
    except scheduling.QuantityError as exc:
        raise FleetError(f"--node-cpus/--node-memory: {exc}")
    if allocatable["cpu"] <= 0 or allocatable["memory"] <= 0:
        raise FleetError("--node-cpus and --node-memory must be positive")
    return allocatable


def cli_argv() -> list[str]:
    local = Path(sys.executable).parent / "specfleet"
    return [str(local)] if local.exists() else [sys.executable, "-m", "specfleet.cli.main"]


def free_port(host: str, taken: set[int]) -> int:
    """A port free on `host` now and not in `taken`, which it joins. The kernel may offer again a port just
    released, such as the gateway's `--port` that a caller probed free and the gateway has yet to bind."""
    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in taken:
            taken.add(port)
            return port


def key_secret(config: FleetConfig) -> dict | None:
    """The Secret the gateway's manifest names (`--api-key-secret NS/NAME`), holding `--api-key-file`'s keys,
    as `kubectl create secret generic NAME --from-literal=keys=...` makes it; None without key files."""
    import base64

    from specfleet.cluster.gateway.keys import parse_secret_ref

    keys = gateway_keys(config).file_keys
    ref = manifest_commands.flag_value(manifest_commands.workload(manifest_commands.GATEWAY).args,
                                       "--api-key-secret")
    if not keys or ref is None:
        return None
    namespace, name = parse_secret_ref(ref)
    data = base64.b64encode(("\n".join(keys) + "\n").encode()).decode()
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "namespace": namespace}, "data": {"keys": data}}


class Fleet:
    def __init__(self, config: FleetConfig, docs: list[dict], console=None):
        from rich.console import Console

        self.config, self.docs = config, docs
        self.console = console or Console()
        self.state_dir = config.state_dir.resolve()
        self.live = self.console.is_terminal if config.live is None else config.live
        for sub in ("logs", "pids", "pods"):
            (self.state_dir / sub).mkdir(parents=True, exist_ok=True)
        self.operator: subprocess.Popen | None = None
        self.gateway: subprocess.Popen | None = None
        self.gateway_health: dict = {}      # the gateway's last /health: stats, readyReplicas per model
        self.prometheus: LocalPrometheus | None = None
        self.identities: dict[str, service_accounts.Identity] = {}
        self.api = None
        self.agent = None
        self.load_stats = {"profile": config.load, "phase": "", "clients": 0, "ok": 0, "failed": 0}
        self.failure: str | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop: asyncio.Event | None = None
        self.stopped_by: str | None = None
        self.stdout_open = True
        self.ports_taken = {config.port}        # ours, bound or about to be: free_port never hands them out

    def say(self, message: str) -> None:
        if self.live or not self.stdout_open:
            return
        try:
            print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)
        except (BrokenPipeError, ValueError):
            self._stdout_closed()

    def _stdout_closed(self) -> None:
        """Nobody reads stdout any more (`up | tee`, tee gone): stop, and never write there again."""
        if not self.stdout_open:
            return
        self.stdout_open = False
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())     # so that the flush at exit cannot fail either
            os.close(devnull)
        self._request_stop("stdout closed")

    def _request_stop(self, why: str) -> None:
        if self.stop is None:
            return
        if self.stop.is_set():          # asked twice: stop the pods now instead of gracefully
            if self.agent is not None:
                self.agent.kill_now()
            return
        self.stopped_by = why
        self.stop.set()

    def run(self) -> int:
        return asyncio.run(self._main())

    def request_stop_threadsafe(self, why: str) -> None:
        """Stop `up` from another thread (a program embedding it, a test), as a signal does."""
        with contextlib.suppress(RuntimeError):        # the loop already closed: `up` has ended
            if self.loop is not None:
                self.loop.call_soon_threadsafe(self._request_stop, why)

    async def _main(self) -> int:
        from specfleet.cluster.apiserver.server import ApiServer, ServerConfig
        from specfleet.cluster.node_agent.agent import NodeAgent
        from specfleet.engine import builtin

        logging.basicConfig(filename=self.state_dir / "logs/fleet.log", level=logging.WARNING,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.stop = asyncio.Event()
        loop = self.loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:       # installed until the very end: a signal during teardown escalates
            loop.add_signal_handler(sig, self._request_stop, signal.Signals(sig).name)
        agent_stop = asyncio.Event()
        agent_task = None
        tasks: list[asyncio.Task] = []
        try:
            self.api = ApiServer(ServerConfig(host="127.0.0.1", port=0)).start()
            endpoint = service_accounts.Endpoint.of(self.api)
            kubeconfig = service_accounts.write_private_kubeconfig(self.state_dir / "kubeconfig", endpoint, TOKEN,
                                                                   ADMIN_USER)     # the user's: the admin
            await self._register_crd()
            await self._apply_rbac(endpoint)
            metrics_port, liveness_port = (free_port(self.config.host, self.ports_taken) for _ in range(2))
            self.prometheus = await self._start_prometheus()
            local = manifest_commands.Local(host=self.config.host, gateway_port=self.config.port,
                                            liveness_port=liveness_port, metrics_port=metrics_port,
                                            api_keys=bool(gateway_keys(self.config).file_keys),
                                            prometheus_url=self.prometheus.url if self.prometheus else None)
            self.gateway = self._start("gateway", manifest_commands.gateway_command(local))
            await self._until_gateway_answers()
            self.operator = self._start("operator", manifest_commands.operator_command(local))
            self.agent = NodeAgent(self.api.url, self.state_dir, host_cache=str(builtin.cache_dir().parent),
                                   on_event=self.say, allocatable=node_allocatable(self.config), token=TOKEN)
            agent_task = asyncio.create_task(self.agent.run(agent_stop, TEARDOWN_GRACE_S))
            await self._apply_manifests()
            self._write_info()
            self.say(f"API emulator {self.api.url}; kubectl --kubeconfig {kubeconfig} get infsvc")
            self.say(f"gateway http://{self.config.host}:{self.config.port}/v1 (waiting for ready replicas)")
            tasks = [asyncio.create_task(self._watch_ready()), asyncio.create_task(self._follow_gateway()),
                     asyncio.create_task(self._watch_child(self.operator, "operator")),
                     asyncio.create_task(self._watch_child(self.gateway, "gateway")),
                     asyncio.create_task(self._watch_stdout())]
            if self.prometheus is not None:
                operator_pod = prometheus.pod_of(manifest_commands.manifest(manifest_commands.OPERATOR).read_text(),
                                                 self.config.host, {"metrics": metrics_port})
                tasks.append(asyncio.create_task(prometheus.follow_pods(self.api.url, TOKEN, self.prometheus,
                                                                        [operator_pod])))
            if self.config.load:
                tasks.append(asyncio.create_task(self._load(self.config.load)))
            if self.live:
                tasks.append(asyncio.create_task(self._live_table()))
            await self.stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            try:
                await self._teardown(agent_stop, agent_task)
            finally:
                for sig in STOP_SIGNALS:
                    loop.remove_signal_handler(sig)
        if self.failure:
            raise FleetError(self.failure)
        return 0

    async def _register_crd(self) -> None:
        from specfleet.cluster.api_client import ApiClient

        async with ApiClient(self.api.url, user_agent="specfleet-up", token=TOKEN) as api:
            await api.create(yaml.safe_load(resources.crd_text()))

    async def _apply_rbac(self, endpoint: service_accounts.Endpoint) -> None:
        """manifests/' ServiceAccounts and RBAC, a kubeconfig per component, the gateway's key Secret."""
        try:
            self.identities = await asyncio.to_thread(service_accounts.component_kubeconfigs, self.api.url,
                                                      self.state_dir, endpoint)
            secret = key_secret(self.config)
            if secret is not None:
                await asyncio.to_thread(service_accounts.apply, self.api.url, secret)
        except service_accounts.RbacError as exc:
            raise FleetError(f"applying manifests/' ServiceAccounts and RBAC: {exc}")

    async def _start_prometheus(self) -> LocalPrometheus | None:
        """The fleet's Prometheus (cluster/prometheus.py), which the operator's loop reads; None when off or
        when the binary is missing (the loop then scrapes each pod, as without Prometheus on a cluster)."""
        wanted = self.config.prometheus
        if wanted is False:
            return None
        if LocalPrometheus.binary() is None:
            if wanted:
                raise FleetError("--prometheus: prometheus is not on PATH (Debian: apt-get install prometheus)")
            self.say("prometheus is not on PATH: the operator scrapes each engine pod itself "
                     "(apt-get install prometheus for the metrics plane)")
            return None
        local = LocalPrometheus(self.state_dir / "prometheus", free_port(self.config.host, self.ports_taken),
                                self.config.host)
        try:
            await asyncio.to_thread(local.start, 30.0, die_with_parent())
        except RuntimeError as exc:
            raise FleetError(str(exc)) from exc
        (self.state_dir / f"pids/prometheus-{local.proc.pid}").write_text(str(local.proc.pid))
        self.say(f"Prometheus {local.url} (config {local.folder / 'prometheus.yml'}): the control loop reads it")
        return local

    def _start(self, component: str, command: manifest_commands.Command) -> subprocess.Popen:
        """`specfleet` + the manifest's args, under the component's ServiceAccount, in its own session."""
        identity = self.identities[component]
        env = {**os.environ, **command.env, "KUBECONFIG": str(identity.kubeconfig), "OMP_NUM_THREADS": "1"}
        log_path = self.state_dir / f"logs/{component}.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen([*cli_argv(), *command.args], env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    preexec_fn=die_with_parent(), cwd=self.state_dir)
        (self.state_dir / f"pids/{component}-{proc.pid}").write_text(str(proc.pid))
        self.say(f"{component} started as {identity.username} (pid {proc.pid}, log {log_path}): "
                 f"specfleet {' '.join(command.args)}")
        return proc

    async def _until_gateway_answers(self) -> None:
        import aiohttp

        deadline = time.monotonic() + GATEWAY_START_S
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            while time.monotonic() < deadline:
                if self.gateway.poll() is not None:
                    raise FleetError(f"the gateway exited with code {self.gateway.returncode}: "
                                     f"{_last_line(self.state_dir / 'logs/gateway.log')}")
                if await self._read_gateway_health(session):
                    return
                await asyncio.sleep(0.2)
        raise FleetError(f"the gateway did not answer within {GATEWAY_START_S:g} s; "
                         f"see {self.state_dir / 'logs/gateway.log'}")

    async def _read_gateway_health(self, session) -> bool:
        """Keep the gateway's /health in `gateway_health`; False while it does not answer."""
        import aiohttp

        try:
            async with session.get(f"http://{self.config.host}:{self.config.port}/health") as response:
                if response.status == 200:
                    self.gateway_health = await response.json()
                    return True
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            pass
        return False

    def _ready_replicas(self) -> dict[str, int]:
        return self.gateway_health.get("readyReplicas") or {}

    async def _apply_manifests(self) -> None:
        from specfleet.cluster.api_client import ApiCallError, ApiClient

        async with ApiClient(self.api.url, user_agent="specfleet-up", token=TOKEN) as api:
            for ns in sorted({d["metadata"]["namespace"] for d in self.docs if d["kind"] != "Namespace"}):
                if await api.get("Namespace", None, ns) is None:
                    await api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
            for doc in sorted(self.docs, key=lambda d: d["kind"] == KIND):
                try:
                    await api.create(doc)
                except ApiCallError as exc:
                    raise FleetError(f"the API server rejected {doc['kind']} {doc['metadata'].get('name')}: "
                                     f"{exc.message}")
                if doc["kind"] == KIND:
                    self.say(f"applied {KIND} {doc['metadata']['namespace']}/{doc['metadata']['name']}")

    def _write_info(self) -> None:
        info = {"pid": os.getpid(), "gateway": f"http://{self.config.host}:{self.config.port}/v1",
                "api": self.api.url, "kubeconfig": str(self.state_dir / "kubeconfig"),
                "operatorPid": self.operator.pid, "gatewayPid": self.gateway.pid,
                "serviceAccounts": {c: i.username for c, i in self.identities.items()}, "started": time.time(),
                "prometheus": self.prometheus.url if self.prometheus else None}
        (self.state_dir / "fleet.json").write_text(json.dumps(info, indent=2))

    async def _watch_child(self, proc: subprocess.Popen, component: str) -> None:
        while proc.poll() is None:
            await asyncio.sleep(0.5)
        self.failure = (f"the {component} exited with code {proc.returncode}; "
                        f"see {self.state_dir / f'logs/{component}.log'}")
        self._request_stop(f"{component} exited")

    async def _follow_gateway(self) -> None:
        """The gateway's counters and ready replicas, from its /health (it runs in its own process)."""
        import aiohttp

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            while True:
                await self._read_gateway_health(session)
                await asyncio.sleep(0.5)

    async def _watch_stdout(self) -> None:
        """A pipe whose reader is gone reports an error on poll: notice it even while `up` says nothing."""
        try:
            fd = sys.stdout.fileno()
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                return
        except (OSError, ValueError):
            return
        poller = select.poll()
        poller.register(fd, 0)            # no events asked: POLLERR/POLLHUP are always reported
        while self.stdout_open:
            if poller.poll(0):
                self._stdout_closed()
                return
            await asyncio.sleep(0.5)

    async def _watch_ready(self) -> None:
        announced: set[str] = set()
        while True:
            for model, replicas in self._ready_replicas().items():
                if replicas and model not in announced:
                    announced.add(model)
                    self.say(f"ready: model {model!r} at http://{self.config.host}:{self.config.port}/v1 "
                             f"({replicas} replica(s))")
            await asyncio.sleep(0.5)

    async def _teardown(self, agent_stop: asyncio.Event, agent_task) -> None:
        """Stop everything; every step runs even when one before it failed."""
        self.say(f"stopping ({self.stopped_by})" if self.stopped_by else "stopping")
        for step in (self._stop_operator_and_gateway, lambda: self._stop_agent(agent_stop, agent_task)):
            try:
                await step()
            except Exception:   # noqa: BLE001  (log it and go on: the next steps must still run)
                logging.getLogger("specfleet.up").exception("teardown step failed")
        if self.prometheus is not None:
            await asyncio.to_thread(self.prometheus.stop)
        if self.api is not None:
            self.api.stop()
        sweep(self.state_dir)
        (self.state_dir / "fleet.json").unlink(missing_ok=True)
        self.say("stopped")

    async def _stop_agent(self, agent_stop: asyncio.Event, agent_task) -> None:
        agent_stop.set()
        if agent_task is None:
            return
        try:
            await asyncio.wait_for(agent_task, TEARDOWN_GRACE_S + 5)
        except asyncio.TimeoutError:
            self.agent.kill_now()

    async def _stop_operator_and_gateway(self) -> None:
        """Both at once, before the pods: the gateway drains its in-flight requests while the engines run."""
        await asyncio.gather(_stop_child(self.operator, OPERATOR_GRACE_S), _stop_child(self.gateway, TEARDOWN_GRACE_S))

    # -- load -------------------------------------------------------------------------------------
    async def _load(self, profile: str) -> None:
        import aiohttp

        phases = LOAD_PROFILES[profile]
        url = f"http://{self.config.host}:{self.config.port}/v1/chat/completions"
        model = next(d["spec"]["model"]["name"] for d in self.docs if d["kind"] == KIND)
        keys = gateway_keys(self.config).file_keys    # a locked gateway: the load clients hold a key too
        headers = {"Authorization": f"Bearer {keys[0]}"} if keys else {}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300), headers=headers) as session:
            while not any(self._ready_replicas().values()):
                await asyncio.sleep(0.5)
            index = 0
            while True:
                seconds, clients = phases[index % len(phases)]
                self.load_stats.update(phase=f"{index % len(phases) + 1}/{len(phases)}", clients=clients)
                self.say(f"load {profile}: phase {index % len(phases) + 1}/{len(phases)}, "
                         f"{clients} clients for {seconds} s")
                deadline = time.monotonic() + seconds
                await asyncio.gather(*(self._client(session, url, model, i, deadline) for i in range(clients)))
                index += 1

    async def _client(self, session, url: str, model: str, i: int, deadline: float) -> None:
        n = i
        while time.monotonic() < deadline:
            body = {"model": model, "max_tokens": 48, "temperature": 0,
                    "messages": [{"role": "user", "content": LOAD_PROMPTS[n % len(LOAD_PROMPTS)]}]}
            n += 1
            try:
                async with session.post(url, json=body) as response:
                    await response.read()
                    self.load_stats["ok" if response.status == 200 else "failed"] += 1
            except Exception:   # noqa: BLE001  (a load client never stops the fleet)
                self.load_stats["failed"] += 1
                await asyncio.sleep(1)

    # -- live table --------------------------------------------------------------------------------
    async def _live_table(self) -> None:
        from rich.live import Live

        from specfleet.cluster.api_client import ApiClient

        async with ApiClient(self.api.url, user_agent="specfleet-up", token=TOKEN) as api:
            with Live(console=self.console, refresh_per_second=2, transient=False) as live:
                while not self.stop.is_set():
                    try:
                        services, pods = await api.list(KIND), await api.list("Pod")
                        events = [m for _, m in list(self.agent.events)[-6:]]
                        live.update(render_status(services, pods, self._summary(), events))
                    except Exception:   # noqa: BLE001  (the table is best effort)
                        pass
                    await asyncio.sleep(1.0)

    def _summary(self) -> dict:
        return {"gateway": f"http://{self.config.host}:{self.config.port}/v1",
                "stats": dict(self.gateway_health.get("stats") or {}),
                "kubeconfig": str(self.state_dir / "kubeconfig"), "load": dict(self.load_stats),
                "prometheus": self.prometheus.url if self.prometheus else None}


async def _stop_child(proc: subprocess.Popen | None, grace_s: float) -> None:
    """SIGTERM the child's process group, SIGKILL it after `grace_s`."""
    if proc is None or proc.poll() is not None:
        return
    kill_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return
        await asyncio.sleep(0.1)
    kill_group(proc.pid, signal.SIGKILL)
    proc.wait()


def _last_line(log: Path) -> str:
    try:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "(no log)"
    return lines[-1] if lines else "(empty log)"


# -- shared by up, status and down ---------------------------------------------------------------------------
def render_status(services: list[dict], pods: list[dict], summary: dict, events: list[str]):
    from rich.console import Group
    from rich.table import Table

    table = Table(title="InferenceServices", title_justify="left", expand=False)
    for column in ("NAME", "MODEL", "PHASE", "READY", "SLO", "TTFT p99", "ITL p99", "SPEC", "ACCEPT", "LAST DECISION"):
        table.add_column(column)
    for s in services:
        st = s.get("status") or {}
        conds = {c["type"]: c for c in st.get("conditions") or []}
        observed, plan = st.get("observed") or {}, st.get("plan") or {}
        spec_plan = plan.get("speculation") or {}
        spec_active = (conds.get("SpeculationActive") or {}).get("status", "-")
        decisions = st.get("lastDecisions") or []
        last = decisions[-1] if decisions else {}
        table.add_row(s["metadata"]["name"], s["spec"]["model"]["name"], st.get("phase", "Pending"),
                      f"{st.get('readyReplicas', 0)}/{st.get('desiredReplicas', '?')}",
                      (conds.get("SLOMet") or {}).get("status", "-"), _ms(observed.get("ttftP99Ms")),
                      _ms(observed.get("itlP99Ms")), f"{spec_active} k={spec_plan.get('k', '-')}",
                      _num(observed.get("acceptanceRate")),
                      f"{last.get('kind', '')} {last.get('from', '')}->{last.get('to', '')}" if last else "-")
    pod_table = Table(title="Pods", title_justify="left")
    for column in ("POD", "READY", "STATUS", "RESTARTS", "ADDRESS", "PID", "AGE"):
        pod_table.add_column(column)
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        st = pod.get("status") or {}
        cs = (st.get("containerStatuses") or [{}])[0]
        state = next(iter(cs.get("state") or {"waiting": {}}), "waiting")
        reason = ((cs.get("state") or {}).get(state) or {}).get("reason", "") or _unschedulable(pod)
        pid = (cs.get("containerID") or "").removeprefix("local://")
        pod_table.add_row(pod["metadata"]["name"], "yes" if cs.get("ready") else "no",
                          reason or state.capitalize(), str(cs.get("restartCount", 0)),
                          pod_address(pod), pid,
                          _age(pod["metadata"].get("creationTimestamp")))
    stats, load = summary.get("stats") or {}, summary.get("load") or {}
    lines = [f"gateway {summary.get('gateway')}   requests {stats.get('requests', 0)}  retries "
             f"{stats.get('retries', 0)}  failed {stats.get('failed', 0)}",
             f"kubectl --kubeconfig {summary.get('kubeconfig')} get infsvc"]
    if summary.get("prometheus"):
        lines.append(f"Prometheus {summary['prometheus']} (the control loop's metrics; the dashboard's queries run "
                     "against it)")
    if load.get("profile"):
        lines.append(f"load {load['profile']}: phase {load['phase']}, {load['clients']} clients, "
                     f"{load['ok']} ok / {load['failed']} failed")
    lines += [f"[dim]{e}[/]" for e in events]
    return Group(table, pod_table, *lines, "[dim]Ctrl-C stops the fleet[/]")


def pod_address(pod: dict) -> str:
    """`podIP:port` of the pod's first container port ("" before it has an address)."""
    ip = (pod.get("status") or {}).get("podIP")
    ports = [p["containerPort"] for c in pod["spec"].get("containers") or [] for p in c.get("ports") or []]
    return f"{ip}:{ports[0]}" if ip and ports else (ip or "")


def _unschedulable(pod: dict) -> str:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return "Unschedulable" if any(c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
                                  for c in conditions) else ""


def _ms(value) -> str:
    return "-" if value is None else f"{value:g} ms"


def _num(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def _age(timestamp: str | None) -> str:
    import datetime as dt

    if not timestamp:
        return "-"
    then = dt.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    seconds = int((dt.datetime.now(dt.timezone.utc) - then).total_seconds())
    return f"{seconds}s" if seconds < 120 else f"{seconds // 60}m"


def sweep(state_dir: Path) -> list[int]:
    """SIGKILL every recorded operator/engine process still alive (their own process groups)."""
    killed = []
    for marker in (state_dir / "pids").glob("*-*"):
        with contextlib.suppress(ValueError, OSError):
            pid = int(marker.read_text())
            if alive(pid) and "specfleet" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                kill_group(pid, signal.SIGKILL)
                killed.append(pid)
        marker.unlink(missing_ok=True)
    return killed


def down(state_dir: Path, timeout_s: float = 30.0) -> str:
    """Stop the `specfleet up` of this state folder; returns what happened, in one line."""
    info = read_info(state_dir)
    pid = (info or {}).get("pid")
    if pid and alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
        strays = sweep(state_dir)
        (state_dir / "fleet.json").unlink(missing_ok=True)
        return f"stopped specfleet (pid {pid})" + (f"; killed {len(strays)} stray process(es)" if strays else "")
    strays = sweep(state_dir)
    (state_dir / "fleet.json").unlink(missing_ok=True)
    if strays:
        return f"specfleet was not running; killed {len(strays)} stray process(es)"
    return f"specfleet is not running in {state_dir}"


def status(state_dir: Path):
    """(renderable, running) for `specfleet status`: one snapshot of what the live table shows."""
    import urllib.request

    info = read_info(state_dir)
    if not info or not alive(info.get("pid", 0)):
        return None

    def get(url: str, token: str | None = None) -> dict:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as response:
            return json.loads(response.read())

    from specfleet.cluster.api_client import path

    services = get(info["api"] + path(KIND), TOKEN).get("items", [])
    pods = get(info["api"] + path("Pod"), TOKEN).get("items", [])
    try:
        stats = get(info["gateway"].removesuffix("/v1") + "/health").get("stats", {})
    except OSError:
        stats = {}
    summary = {"gateway": info["gateway"], "stats": stats, "kubeconfig": info["kubeconfig"],
               "prometheus": info.get("prometheus")}
    return render_status(services, pods, summary, [])
