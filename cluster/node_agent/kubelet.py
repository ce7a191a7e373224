"""The kubelet half of the node agent: one `PodRunner` per Pod bound to this node.

A runner prepares the pod's volumes, runs init containers to completion, then keeps every container
running as a local process (own session, log file under the state folder), restarting it on exit with
exponential back-off (1 s doubling to 30 s, reset after a minute of uptime). Readiness comes from the
readiness probe (httpGet or tcpSocket on the pod's address), liveness kills a hung process. Each pod has
its own loopback address (`addresses.py`), given back once its processes have exited. Every change is
written back to `pods/status` (phase, conditions, podIP, containerStatuses with restartCount).
Stopping is SIGTERM to the process group, then SIGKILL after the grace period (`grace_s`: the pod's
`deletionGracePeriodSeconds` when it is being deleted, see `agent.py`); once a container's main process
has exited, what is left of its group is killed, as a container's processes end with it. `vllm serve`
containers run on a vLLM of this machine (`vllm_peer.py`).
"""
from __future__ import annotations

import asyncio
import datetime as dt
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import aiohttp

from specfleet.cluster.api_client import ApiCallError, ApiClient
from specfleet.cluster.children import die_with_parent, kill_group
from specfleet.cluster.node_agent import volumes as vol
from specfleet.cluster.node_agent import vllm_peer
from specfleet.cluster.node_agent.addresses import NODE_IP, AddressesExhausted, PodAddresses, container_ports
from specfleet.engine import builtin

BACKOFF_START_S, BACKOFF_MAX_S, BACKOFF_RESET_S = 1.0, 30.0, 60.0


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


@dataclass
class ContainerStatus:
    name: str
    image: str = ""
    ready: bool = False
    started: bool = False
    restart_count: int = 0
    state: dict = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: dict = field(default_factory=dict)
    pid: int | None = None

    def as_dict(self) -> dict:
        return {"name": self.name, "image": self.image, "imageID": "", "ready": self.ready, "started": self.started,
                "restartCount": self.restart_count, "state": self.state, "lastState": self.last_state,
                "containerID": f"local://{self.pid}" if self.pid else ""}


class Node(Protocol):
    """What a runner uses of its node agent (`agent.NodeAgent`)."""

    state_dir: Path
    node_name: str
    host_cache: str | None
    api: ApiClient
    http: aiohttp.ClientSession
    addresses: PodAddresses

    def event(self, message: str) -> None: ...

    def track_pid(self, pid: int, alive: bool) -> None: ...


class PodRunner:
    """Runs one Pod as local processes until `stop()`."""

    def __init__(self, agent: Node, pod: dict):
        meta, spec = pod["metadata"], pod["spec"]
        self.agent, self.pod = agent, pod
        self.uid, self.name, self.namespace = meta["uid"], meta["name"], meta.get("namespace", "default")
        self.dir = agent.state_dir / "pods" / f"{self.namespace}_{self.name}"
        self.grace_s = float(spec.get("terminationGracePeriodSeconds", 30))
        self.containers = [ContainerStatus(c["name"], c.get("image", "")) for c in spec.get("containers") or []]
        self.init_statuses = [ContainerStatus(c["name"], c.get("image", "")) for c in spec.get("initContainers") or []]
        self.phase, self.reason, self.message = "Pending", "", ""
        self.initialized = not self.init_statuses
        self.start_time = now_iso()
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.stopping = False
        self._wake = asyncio.Event()
        self._sent: dict | None = None
        self._cond_times: dict[str, tuple[str, str]] = {}
        self._lock = asyncio.Lock()
        try:
            self.ip: str | None = agent.addresses.allocate(self.uid, container_ports(spec))
        except AddressesExhausted as exc:
            self.ip = None
            self._waiting_all("CreatePodSandboxError", str(exc))
        self.task = asyncio.create_task(self.run())
        self.task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.agent.event(f"{self.namespace}/{self.name}: the kubelet failed: {task.exception()!r}")

    # -- lifecycle ----------------------------------------------------------------------------------
    async def run(self) -> None:
        await self.report()
        if self.ip is None:
            return
        mounts = await self._prepare_until_ready()
        if mounts is None:
            return
        for container, status in zip(self.pod["spec"].get("initContainers") or [], self.init_statuses):
            if not await self._run_init(container, status, mounts[container["name"]]):
                return
        self.initialized = True
        await asyncio.gather(*(self._supervise(c, s, mounts[c["name"]])
                               for c, s in zip(self.pod["spec"]["containers"], self.containers)))

    async def stop(self, grace_s: float | None = None) -> None:
        """SIGTERM every process, SIGKILL after the grace period, then end the runner."""
        self.stopping = True
        self._wake.set()
        grace = self.grace_s if grace_s is None else min(grace_s, self.grace_s)
        procs = [p for p in self.procs.values() if p.returncode is None]
        for proc in procs:
            kill_group(proc.pid, signal.SIGTERM)
            self.agent.event(f"{self.namespace}/{self.name}: stopping pid {proc.pid} (SIGTERM)")
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), timeout=grace)
        except asyncio.TimeoutError:
            for proc in procs:
                kill_group(proc.pid, signal.SIGKILL)
            await asyncio.gather(*(p.wait() for p in procs))
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        self.agent.addresses.release(self.uid)

    def kill_now(self) -> None:
        """SIGKILL everything at once (teardown after the grace period, or a crash of the agent)."""
        for proc in self.procs.values():
            if proc.returncode is None:
                kill_group(proc.pid, signal.SIGKILL)

    async def _prepare_until_ready(self) -> dict[str, list] | None:
        while not self.stopping:
            try:
                return await self._prepare()
            except vol.PodConfigError as exc:
                self._waiting_all(exc.reason, str(exc))
                await self.report()
            await self._sleep(2.0)
        return None

    async def _prepare(self) -> dict[str, list]:
        spec = self.pod["spec"]
        dirs: dict[str, Path] = {}
        for volume in spec.get("volumes") or []:
            dirs[volume["name"]] = await self._volume(volume)
        return {c["name"]: vol.mount_map(spec, c, dirs)
                for c in [*(spec.get("initContainers") or []), *spec.get("containers", [])]}

    async def _volume(self, volume: dict) -> Path:
        kind, source = vol.volume_source(volume)
        folder = self.dir / "volumes" / volume["name"]
        if kind == "hostPath":
            return Path(source["path"])
        if kind in ("secret", "configMap"):
            ref = source.get("secretName") if kind == "secret" else source.get("name")
            obj = await self.agent.api.get("Secret" if kind == "secret" else "ConfigMap", self.namespace, ref)
            if obj is None and not source.get("optional"):
                raise vol.PodConfigError("CreateContainerConfigError", f"{kind} {ref!r} not found")
            vol.write_keys(folder, vol.decode(obj or {}), source)
            return folder
        if kind in vol.UNSUPPORTED:
            raise vol.PodConfigError("CreateContainerConfigError",
                                     f"{kind} volumes are not supported by the local node agent")
        folder.mkdir(parents=True, exist_ok=True)   # emptyDir, and anything else as an empty folder
        return folder

    async def _run_init(self, container: dict, status: ContainerStatus, mounts: list) -> bool:
        backoff = BACKOFF_START_S
        while not self.stopping:
            rc = await self._run_once(container, status, mounts)
            if rc == 0:
                status.state = {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": now_iso()}}
                await self.report()
                return True
            if rc is None or self.stopping:
                return False
            status.restart_count += 1
            status.state = {"waiting": {"reason": "CrashLoopBackOff", "message": f"init container exited {rc}"}}
            await self.report()
            await self._sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)
        return False

    async def _supervise(self, container: dict, status: ContainerStatus, mounts: list) -> None:
        backoff = BACKOFF_START_S
        while not self.stopping:
            started = time.monotonic()
            rc = await self._run_once(container, status, mounts, probe=True)
            if self.stopping or rc is None:
                return
            status.restart_count += 1
            if time.monotonic() - started > BACKOFF_RESET_S:
                backoff = BACKOFF_START_S
            status.state = {"waiting": {"reason": "CrashLoopBackOff",
                                        "message": f"back-off {backoff:g}s restarting failed container"}}
            self.agent.event(f"{self.namespace}/{self.name}: container {status.name} exited with {rc}; "
                             f"restart {status.restart_count} in {backoff:g} s")
            await self.report()
            await self._sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    async def _run_once(self, container: dict, status: ContainerStatus, mounts: list,
                        probe: bool = False) -> int | None:
        """Start the container's process and wait for it; None when it could not start."""
        try:
            argv = await self._argv(container, mounts)
            env = await self._env(container, mounts)
        except vol.PodConfigError as exc:
            status.state = {"waiting": {"reason": exc.reason, "message": str(exc)}}
            await self.report()
            await self._sleep(5.0)
            return None if self.stopping else -1
        logs = self.agent.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{self.namespace}_{self.name}_{status.name}.log", "ab") as log:
            log.write(f"--- {now_iso()} start: {' '.join(argv)}\n".encode())
            log.flush()
            cwd = vol.translate(container.get("workingDir") or "", mounts) or str(self.dir)
            Path(cwd).mkdir(parents=True, exist_ok=True)
            proc = await asyncio.create_subprocess_exec(*argv, env=env, cwd=cwd, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=log, stderr=asyncio.subprocess.STDOUT,
                                                        start_new_session=True, preexec_fn=die_with_parent())
        self.procs[status.name] = proc
        self.agent.track_pid(proc.pid, True)
        started_at = now_iso()
        status.pid, status.started = proc.pid, True
        status.state = {"running": {"startedAt": started_at}}
        self.phase = "Running"
        await self.report()
        prober = asyncio.create_task(self._probe(container, status, proc)) if probe else None
        try:
            rc = await proc.wait()
        finally:
            if prober:
                prober.cancel()
            kill_group(proc.pid, signal.SIGKILL)    # what outlives the main process dies with its container
            self.agent.track_pid(proc.pid, False)
        status.ready = False
        reason = "Completed" if rc == 0 else ("Killed" if rc < 0 else "Error")
        status.last_state = {"terminated": {"exitCode": rc if rc >= 0 else 128 - rc, "reason": reason,
                                            "startedAt": started_at, "finishedAt": now_iso()}}
        if self.stopping:
            status.state, status.last_state = status.last_state, {}
        await self.report()
        return rc

    async def _argv(self, container: dict, mounts: list) -> list[str]:
        if not vllm_peer.is_vllm_serve(container):
            return vol.container_argv(container, mounts, self.ip)
        return vllm_peer.container_argv(container, mounts, self.ip, await self._pull_builtin(container))

    async def _pull_builtin(self, container: dict) -> dict[str, str]:
        """The built-in model a vLLM container names, converted once into the node's cache (a vLLM image
        would hold it): {Hugging Face id: local folder}."""
        named = vllm_peer.builtin_model(container)
        if named is None:
            return {}
        try:
            folder = await asyncio.to_thread(builtin.ensure_builtin, named[0])
        except (OSError, ImportError) as exc:
            raise vol.PodConfigError("ErrImagePull", f"built-in model {named[0]}: {exc}")
        return {named[1]: str(folder)}

    async def _env(self, container: dict, mounts: list) -> dict[str, str]:
        env = vol.base_env(self.agent.host_cache)
        if vllm_peer.is_vllm_serve(container):
            env.update(vllm_peer.runtime_env(container, self.agent.state_dir / "cache"))
        for item in container.get("env") or []:
            value = await self._env_value(item)
            if value is not None:
                env[item["name"]] = vol.translate(value, mounts)
        for source in container.get("envFrom") or []:
            ref = source.get("secretRef") or source.get("configMapRef") or {}
            kind = "Secret" if "secretRef" in source else "ConfigMap"
            obj = await self.agent.api.get(kind, self.namespace, ref.get("name", ""))
            for key, value in vol.decode(obj or {}).items():
                env[source.get("prefix", "") + key] = value.decode()
        return env

    async def _env_value(self, item: dict) -> str | None:
        if "value" in item or "valueFrom" not in item:
            return str(item.get("value", ""))
        source = item["valueFrom"]
        if "fieldRef" in source:
            fields = {"metadata.name": self.name, "metadata.namespace": self.namespace, "metadata.uid": self.uid,
                      "status.podIP": self.ip, "status.hostIP": NODE_IP, "spec.nodeName": self.agent.node_name}
            return fields.get(source["fieldRef"].get("fieldPath"), "")
        ref = source.get("secretKeyRef") or source.get("configMapKeyRef")
        if ref is None:
            return None
        kind = "Secret" if "secretKeyRef" in source else "ConfigMap"
        obj = await self.agent.api.get(kind, self.namespace, ref.get("name", ""))
        value = vol.decode(obj or {}).get(ref.get("key", ""))
        if value is None:
            if ref.get("optional"):
                return None
            raise vol.PodConfigError("CreateContainerConfigError", f"{kind} {ref.get('name')!r} key "
                                     f"{ref.get('key')!r} not found")
        return value.decode()

    # -- probes -------------------------------------------------------------------------------------
    async def _probe(self, container: dict, status: ContainerStatus, proc) -> None:
        readiness, liveness = container.get("readinessProbe"), container.get("livenessProbe")
        failures, live_failures, last_live = 0, 0, time.monotonic()
        await asyncio.sleep(0.3)
        while proc.returncode is None:
            ok = await self._check(readiness, container) if readiness else True
            failures = 0 if ok else failures + 1
            ready = ok or (status.ready and failures < (readiness or {}).get("failureThreshold", 3))
            if ready != status.ready:
                status.ready = ready
                self.agent.event(f"{self.namespace}/{self.name}: {'ready' if ready else 'not ready'}")
                await self.report()
            if liveness and status.ready and time.monotonic() - last_live >= liveness.get("periodSeconds", 10):
                last_live = time.monotonic()
                live_failures = 0 if await self._check(liveness, container) else live_failures + 1
                if live_failures >= liveness.get("failureThreshold", 3):
                    self.agent.event(f"{self.namespace}/{self.name}: liveness failed; killing pid {proc.pid}")
                    kill_group(proc.pid, signal.SIGKILL)
                    return
            period = (readiness or {}).get("periodSeconds", 1)
            await asyncio.sleep(min(period, 1.0) if status.ready else 0.3)

    async def _check(self, probe: dict, container: dict) -> bool:
        timeout = probe.get("timeoutSeconds", 1)
        ref = (probe.get("httpGet") or probe.get("tcpSocket") or {}).get("port")
        if ref is not None and self.port(ref, container) is None:
            return False
        if "httpGet" in probe:
            get = probe["httpGet"]
            url = f"http://{self.ip}:{self.port(get.get('port'), container)}{get.get('path', '/')}"
            try:
                async with self.agent.http.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as response:
                    return 200 <= response.status < 400
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                return False
        if "tcpSocket" in probe:
            try:
                port = self.port(probe["tcpSocket"].get("port"), container)
                _, writer = await asyncio.wait_for(asyncio.open_connection(self.ip, port), timeout)
                writer.close()
                return True
            except (OSError, asyncio.TimeoutError):
                return False
        return True   # exec probes: not run locally; the process being up is the signal

    @staticmethod
    def port(ref, container: dict) -> int | None:
        """A probe's port: a number, or the name of one of the container's ports (None: no such name)."""
        if isinstance(ref, str) and not ref.isdigit():
            named = next((p["containerPort"] for p in container.get("ports") or [] if p.get("name") == ref), None)
            return None if named is None else int(named)
        return int(ref)

    # -- status ---------------------------------------------------------------------------------------
    def _waiting_all(self, reason: str, message: str) -> None:
        for status in self.containers:
            status.state = {"waiting": {"reason": reason, "message": message}}
        self.reason, self.message = reason, message

    def status(self) -> dict:
        all_ready = bool(self.containers) and all(c.ready for c in self.containers)
        conditions = [self._condition("PodScheduled", True), self._condition("Initialized", self.initialized),
                      self._condition("ContainersReady", all_ready), self._condition("Ready", all_ready)]
        status = {"phase": self.phase, "conditions": conditions, "hostIP": NODE_IP, "startTime": self.start_time,
                  "qosClass": "Burstable", "containerStatuses": [c.as_dict() for c in self.containers]}
        if self.ip is not None:
            status.update(podIP=self.ip, podIPs=[{"ip": self.ip}])
        if self.init_statuses:
            status["initContainerStatuses"] = [c.as_dict() for c in self.init_statuses]
        if self.reason:
            status.update(reason=self.reason, message=self.message)
        return status

    def _condition(self, kind: str, ok: bool) -> dict:
        value = "True" if ok else "False"
        old = self._cond_times.get(kind)
        if old is None or old[0] != value:
            self._cond_times[kind] = (value, now_iso())
        return {"type": kind, "status": value, "lastProbeTime": None,
                "lastTransitionTime": self._cond_times[kind][1]}

    @property
    def ready(self) -> bool:
        return bool(self.containers) and all(c.ready for c in self.containers)

    async def report(self) -> None:
        async with self._lock:
            status = self.status()
            if status == self._sent:
                return
            try:
                await self.agent.api.patch("Pod", self.namespace, self.name, {"status": status}, "status")
                self._sent = status
            except ApiCallError as exc:
                if exc.status != 404:
                    self.agent.event(f"{self.namespace}/{self.name}: status update failed: {exc}")
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._wake.wait(), seconds)
        except asyncio.TimeoutError:
            pass
