"""`NodeAgent`: the local node's control loop, a Deployment controller, a scheduler and a kubelet in one task.

`NodeAgent(api_url, state_dir).run(stop_event)` registers the Node (this machine's CPUs and memory as
allocatable) and polls the API server every half second: Deployments -> ReplicaSets -> Pods
(`controller.py`), unbound Pods -> bound to the node when their requests fit (`scheduling.py`), Pods
bound to the node -> local processes on their own loopback address (`kubelet.py`, `addresses.py`).
Status flows back as on a real cluster, Events included. A deleted pod stays in the API, terminating, until
its processes have stopped (within its `deletionGracePeriodSeconds`); then the agent deletes it with grace 0.
"""
from __future__ import annotations

import asyncio
import collections
import secrets
import time
from pathlib import Path
from typing import Callable

import aiohttp

from specfleet.cluster.api_client import ApiCallError, ApiClient
from specfleet.cluster.node_agent import scheduling
from specfleet.cluster.node_agent.addresses import NODE_IP, PodAddresses
from specfleet.cluster.node_agent.controller import DeploymentController
from specfleet.cluster.node_agent.kubelet import PodRunner, now_iso

NODE_NAME = "specfleet-local"
SCHEDULER_NAME = "default-scheduler"


class NodeAgent:
    def __init__(self, api_url: str, state_dir: Path, node_name: str = NODE_NAME, host_cache: str | None = None,
                 interval_s: float = 0.5, on_event: Callable[[str], None] | None = None,
                 allocatable: dict[str, int] | None = None, token: str | None = None):
        self.api_url, self.state_dir, self.node_name = api_url, Path(state_dir), node_name
        self.token = token          # the node's credentials (the emulator's admin token under `specfleet up`)
        self.host_cache, self.interval_s, self.on_event = host_cache, interval_s, on_event
        self.allocatable = allocatable or scheduling.machine_allocatable()
        self.runners: dict[str, PodRunner] = {}
        self.addresses = PodAddresses()
        self.events: collections.deque[tuple[float, str]] = collections.deque(maxlen=200)
        self.api: ApiClient | None = None
        self.http: aiohttp.ClientSession | None = None
        self._retiring: dict[asyncio.Task, PodRunner | None] = {}    # runners of deleted pods, while they stop
        self._terminating: set[str] = set()           # uids of pods whose graceful stop has begun
        self._unschedulable: dict[str, str] = {}      # pod uid -> the message last reported
        self._queue = scheduling.SchedulingQueue()

    def event(self, message: str) -> None:
        self.events.append((time.time(), message))
        if self.on_event:
            self.on_event(message)

    def track_pid(self, pid: int, alive: bool) -> None:
        """Keep `state_dir/pids/pod-PID` while a process runs, so `specfleet down` can find strays."""
        folder = self.state_dir / "pids"
        folder.mkdir(parents=True, exist_ok=True)
        marker = folder / f"pod-{pid}"
        if alive:
            marker.write_text(str(pid))
        else:
            marker.unlink(missing_ok=True)

    async def run(self, stop: asyncio.Event, shutdown_grace_s: float = 10.0) -> None:
        async with ApiClient(self.api_url, token=self.token) as api, aiohttp.ClientSession() as http:
            self.api, self.http = api, http
            try:
                await self._register_node()
                while not stop.is_set():
                    try:
                        await self.tick()
                    except (ApiCallError, aiohttp.ClientError, asyncio.TimeoutError) as exc:
                        self.event(f"node agent: {exc}")
                    try:
                        await asyncio.wait_for(stop.wait(), self.interval_s)
                    except asyncio.TimeoutError:
                        pass
            finally:
                await self.shutdown(shutdown_grace_s)

    async def shutdown(self, grace_s: float) -> None:
        retiring = [r for r in self._retiring.values() if r is not None]

        async def deadline() -> None:      # pods already terminating get no longer than the teardown's grace
            await asyncio.sleep(grace_s)
            for runner in retiring:
                runner.kill_now()
        killer = asyncio.create_task(deadline())
        await asyncio.gather(*(r.stop(grace_s) for r in self.runners.values()), *self._retiring,
                             return_exceptions=True)
        killer.cancel()
        self.runners = {}

    def kill_now(self) -> None:
        """SIGKILL every pod process at once (when a graceful shutdown took too long)."""
        for runner in [*self.runners.values(), *self._retiring.values()]:
            if runner is not None:
                runner.kill_now()

    async def tick(self) -> None:
        deployments = await self.api.list("Deployment")
        replica_sets = await self.api.list("ReplicaSet")
        pods = await self.api.list("Pod")
        await DeploymentController(self.api, self.event).sync(deployments, replica_sets, pods)
        await self._schedule(pods)
        self._sync_pods(pods)

    # -- scheduler ------------------------------------------------------------------------------------
    async def _schedule(self, pods: list[dict]) -> None:
        live = [p for p in pods if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
        bound = [p for p in live if p["spec"].get("nodeName") == self.node_name]
        pending = [p for p in live if not p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
                   and p["spec"].get("schedulerName", SCHEDULER_NAME) == SCHEDULER_NAME]
        for decision in scheduling.schedule(self._queue.order(pending), bound, self.allocatable):
            if decision.fits:
                await self._bind(decision.pod)
            else:
                await self._refuse(decision.pod, decision.message)

    async def _bind(self, pod: dict) -> None:
        meta = pod["metadata"]
        await self.api.bind(meta["namespace"], meta["name"], self.node_name, meta["uid"])
        pod["spec"]["nodeName"] = self.node_name
        self._unschedulable.pop(meta["uid"], None)
        await self._pod_event(pod, "Normal", "Scheduled",
                              f"Successfully assigned {meta['namespace']}/{meta['name']} to {self.node_name}")

    async def _refuse(self, pod: dict, message: str) -> None:
        meta = pod["metadata"]
        if self._unschedulable.get(meta["uid"]) == message:
            return
        self._unschedulable[meta["uid"]] = message
        condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
                     "lastProbeTime": None, "lastTransitionTime": now_iso()}
        await self.api.patch("Pod", meta["namespace"], meta["name"],
                             {"status": {"phase": "Pending", "conditions": [condition]}}, "status")
        await self._pod_event(pod, "Warning", "FailedScheduling", message)
        self.event(f"{meta['namespace']}/{meta['name']}: unschedulable: {message}")

    async def _pod_event(self, pod: dict, kind: str, reason: str, message: str) -> None:
        meta, now = pod["metadata"], now_iso()
        await self.api.create({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{secrets.token_hex(8)}", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta["uid"]},
            "type": kind, "reason": reason, "message": message, "count": 1,
            "firstTimestamp": now, "lastTimestamp": now, "source": {"component": SCHEDULER_NAME}})

    # -- kubelet --------------------------------------------------------------------------------------
    def _sync_pods(self, pods: list[dict]) -> None:
        mine = [p for p in pods if p["spec"].get("nodeName") == self.node_name
                and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
        bound = {p["metadata"]["uid"]: p for p in mine if not p["metadata"].get("deletionTimestamp")}
        for uid, pod in bound.items():
            if uid not in self.runners:
                self.runners[uid] = PodRunner(self, pod)
        for pod in mine:
            uid = pod["metadata"]["uid"]
            if pod["metadata"].get("deletionTimestamp") and uid not in self._terminating:
                self._terminating.add(uid)
                self._retire(self.runners.pop(uid, None), pod)
        for uid in [u for u in self.runners if u not in bound]:     # gone from the API: force-deleted
            self._retire(self.runners.pop(uid), None)
        present = {p["metadata"]["uid"] for p in pods}
        self._unschedulable = {uid: m for uid, m in self._unschedulable.items() if uid in present}
        self._terminating &= present

    def _retire(self, runner: PodRunner | None, pod: dict | None) -> None:
        """Stop a runner in the background; for a terminating pod, then delete it for good (grace 0)."""
        task = asyncio.create_task(self._terminate(runner, pod))
        self._retiring[task] = runner
        task.add_done_callback(lambda done: self._retiring.pop(done, None))

    async def _terminate(self, runner: PodRunner | None, pod: dict | None) -> None:
        """What a kubelet does with a pod whose deletion started: SIGTERM, up to the pod's
        `deletionGracePeriodSeconds`, SIGKILL, then the DELETE with grace 0 that removes it from the API."""
        if runner is not None:
            if pod is not None:
                runner.grace_s = float(pod["metadata"].get("deletionGracePeriodSeconds") or 0)
            await runner.stop()
        if pod is None:
            return
        meta = pod["metadata"]
        try:
            await self.api.delete("Pod", meta["namespace"], meta["name"], grace_period_s=0, uid=meta["uid"])
        except (ApiCallError, aiohttp.ClientError, asyncio.TimeoutError) as exc:
            self._terminating.discard(meta["uid"])          # the next tick deletes it again
            self.event(f"{meta['namespace']}/{meta['name']}: could not delete the stopped pod: {exc}")
            return
        self.event(f"{meta['namespace']}/{meta['name']}: terminated")

    async def _register_node(self) -> None:
        quantities = scheduling.node_quantities(self.allocatable)
        status = {"capacity": quantities, "allocatable": quantities,
                  "addresses": [{"type": "InternalIP", "address": NODE_IP},
                                {"type": "Hostname", "address": self.node_name}],
                  "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                  "message": "the local node agent is running"}]}
        if await self.api.get("Node", None, self.node_name) is None:
            await self.api.create({"apiVersion": "v1", "kind": "Node",
                                   "metadata": {"name": self.node_name,
                                                "labels": {"kubernetes.io/hostname": self.node_name}}})
        await self.api.patch("Node", None, self.node_name, {"status": status}, "status")
