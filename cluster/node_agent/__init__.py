"""The local node agent: a Deployment controller and a kubelet in one asyncio task (docs/fleet.md).

`NodeAgent(api_url, state_dir).run(stop_event)` polls the API server every half second: Deployments ->
ReplicaSets -> Pods (`controller.py`), and Pods bound to this node -> local processes (`kubelet.py`, with
`volumes.py` translating volumes, env and ports). Status flows back like on a real cluster.
"""
from __future__ import annotations

import asyncio
import collections
import json
import os
import time
from pathlib import Path
from typing import Callable

import aiohttp

from specfleet.cluster.node_agent import controller as ctl
from specfleet.cluster.node_agent.kube import Kube, KubeError
from specfleet.cluster.node_agent.kubelet import ENDPOINT_ANNOTATION, PORTS_ANNOTATION, PodRunner

NODE_NAME = "specfleet-local"
SERVICE_LABEL = "specfleet.io/inferenceservice"


class NodeAgent:
    def __init__(self, api_url: str, state_dir: Path, node_name: str = NODE_NAME, host_cache: str | None = None,
                 interval_s: float = 0.5, on_event: Callable[[str], None] | None = None):
        self.api_url, self.state_dir, self.node_name = api_url, Path(state_dir), node_name
        self.host_cache, self.interval_s, self.on_event = host_cache, interval_s, on_event
        self.runners: dict[str, PodRunner] = {}
        self.events: collections.deque[tuple[float, str]] = collections.deque(maxlen=200)
        self.kube: Kube | None = None
        self.http: aiohttp.ClientSession | None = None
        self._stopping: set[asyncio.Task] = set()
        self._ports: set[int] = set()
        self._endpoints_text: str | None = None

    def event(self, message: str) -> None:
        self.events.append((time.time(), message))
        if self.on_event:
            self.on_event(message)

    def track_pid(self, pid: int, alive: bool) -> None:
        """Keep `state_dir/pids/engine-PID` while a process runs, so `specfleet down` can find strays."""
        folder = self.state_dir / "pids"
        folder.mkdir(parents=True, exist_ok=True)
        marker = folder / f"pod-{pid}"
        if alive:
            marker.write_text(str(pid))
        else:
            marker.unlink(missing_ok=True)

    async def run(self, stop: asyncio.Event, shutdown_grace_s: float = 10.0) -> None:
        async with Kube(self.api_url) as kube, aiohttp.ClientSession() as http:
            self.kube, self.http = kube, http
            try:
                await self._register_node()
                while not stop.is_set():
                    try:
                        await self.tick()
                    except (KubeError, aiohttp.ClientError, asyncio.TimeoutError) as exc:
                        self.event(f"node agent: {exc}")
                    try:
                        await asyncio.wait_for(stop.wait(), self.interval_s)
                    except asyncio.TimeoutError:
                        pass
            finally:
                await self.shutdown(shutdown_grace_s)

    async def shutdown(self, grace_s: float) -> None:
        runners, self.runners = list(self.runners.values()), {}
        await asyncio.gather(*(r.stop(grace_s) for r in runners), *self._stopping, return_exceptions=True)

    async def tick(self) -> None:
        deployments = await self.kube.list("Deployment")
        replica_sets = await self.kube.list("ReplicaSet")
        pods = await self.kube.list("Pod")
        self._ports |= _ports_of(pods)
        by_owner: dict[str, list[dict]] = collections.defaultdict(list)
        for pod in pods:
            if not pod["metadata"].get("deletionTimestamp"):
                by_owner[ctl.controller_uid(pod)].append(pod)
        owned = set()
        for deployment in deployments:
            if not deployment["metadata"].get("deletionTimestamp"):
                for rs in await self._sync_deployment(deployment, replica_sets, by_owner):
                    owned.add(rs["metadata"]["uid"])
                    await self._sync_replica_set(rs, by_owner[rs["metadata"]["uid"]])
        for rs in replica_sets:
            if rs["metadata"]["uid"] not in owned and not rs["metadata"].get("deletionTimestamp"):
                await self._sync_replica_set(rs, by_owner[rs["metadata"]["uid"]])
        self._sync_pods(pods)
        self._write_endpoints(pods)

    def _write_endpoints(self, pods: list[dict]) -> None:
        """`endpoints.json`: {"ns/inferenceservice": {pod: url}} of Ready pods, for the operator's control
        loop (`SPECFLEET_POD_ENDPOINTS_FILE`), which otherwise assumes podIP:8000."""
        table: dict[str, dict[str, str]] = collections.defaultdict(dict)
        for pod in pods:
            meta = pod["metadata"]
            owner = (meta.get("labels") or {}).get(SERVICE_LABEL)
            url = (meta.get("annotations") or {}).get(ENDPOINT_ANNOTATION)
            if owner and url and ctl.is_ready(pod):
                table[f"{meta.get('namespace', 'default')}/{owner}"][meta["name"]] = url
        text = json.dumps(table, sort_keys=True)
        if text != self._endpoints_text:
            target = self.state_dir / "endpoints.json"
            tmp = target.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(target)
            self._endpoints_text = text

    # -- Deployment controller ------------------------------------------------------------------------
    async def _sync_deployment(self, deployment: dict, replica_sets: list[dict],
                               by_owner: dict[str, list[dict]]) -> list[dict]:
        uid, spec = deployment["metadata"]["uid"], deployment["spec"]
        digest = ctl.template_hash(spec["template"])
        mine = sorted((rs for rs in replica_sets if ctl.controller_uid(rs) == uid), key=_revision)
        new = next((rs for rs in mine if rs["metadata"].get("labels", {}).get(ctl.HASH_LABEL) == digest), None)
        if new is None:
            new = await self.kube.create(ctl.replica_set_for(deployment, digest, _revision(mine[-1]) + 1
                                                             if mine else 1))
            self.event(f"{deployment['metadata']['name']}: new ReplicaSet {new['metadata']['name']}")
            mine.append(new)
        olds = [rs for rs in mine if rs is not new and (rs["spec"].get("replicas", 0) or by_owner[_uid(rs)])]
        desired = spec.get("replicas", 1)
        surge, unavailable = ctl.rollout_limits(deployment, desired)
        new_target, old_targets = ctl.scale_plan(desired, surge, unavailable, _counts(new, by_owner)[:2],
                                                 [_counts(rs, by_owner) for rs in olds])
        for rs, target in [(new, new_target), *zip(olds, old_targets)]:
            if rs["spec"].get("replicas", 0) != target:
                rs = await self.kube.patch("ReplicaSet", rs["metadata"]["namespace"], rs["metadata"]["name"],
                                           {"spec": {"replicas": target}})
                mine = [rs if _uid(m) == _uid(rs) else m for m in mine]
        pods = [p for rs in mine for p in by_owner[_uid(rs)]]
        status = ctl.deployment_status(deployment, desired, len(pods), len(by_owner[_uid(new)]),
                                       sum(map(ctl.is_ready, pods)), deployment.get("status"))
        if not ctl.same_status(deployment.get("status"), status):
            await self.kube.patch("Deployment", deployment["metadata"]["namespace"], deployment["metadata"]["name"],
                                  {"status": status}, "status")
        return mine

    async def _sync_replica_set(self, rs: dict, pods: list[dict]) -> None:
        want, namespace = rs["spec"].get("replicas", 1), rs["metadata"]["namespace"]
        for _ in range(want - len(pods)):
            pod = await self.kube.create(ctl.pod_for(rs, self.node_name, self._ports))
            self.event(f"{namespace}/{pod['metadata']['name']}: created "
                       f"({pod['metadata']['annotations'][ctl.ENDPOINT_ANNOTATION]})")
        if len(pods) > want:
            order = sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp", ""), reverse=True)
            order.sort(key=ctl.is_ready)
            for pod in order[:len(pods) - want]:
                await self.kube.delete("Pod", namespace, pod["metadata"]["name"])
                self.event(f"{namespace}/{pod['metadata']['name']}: deleted (scale down)")
        ready = sum(map(ctl.is_ready, pods))
        status = {"replicas": len(pods), "fullyLabeledReplicas": len(pods), "readyReplicas": ready,
                  "availableReplicas": ready, "observedGeneration": rs["metadata"].get("generation", 1)}
        if any((rs.get("status") or {}).get(k) != v for k, v in status.items()):
            await self.kube.patch("ReplicaSet", namespace, rs["metadata"]["name"], {"status": status}, "status")

    # -- kubelet --------------------------------------------------------------------------------------
    def _sync_pods(self, pods: list[dict]) -> None:
        bound = {p["metadata"]["uid"]: p for p in pods
                 if p["spec"].get("nodeName") == self.node_name and not p["metadata"].get("deletionTimestamp")
                 and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")}
        for uid, pod in bound.items():
            if uid not in self.runners:
                self.runners[uid] = PodRunner(self, pod)
        for uid in [u for u in self.runners if u not in bound]:
            runner = self.runners.pop(uid)
            task = asyncio.create_task(runner.stop())
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)

    async def _register_node(self) -> None:
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": self.node_name, "labels": {"kubernetes.io/hostname": self.node_name}},
                "status": {"capacity": {"cpu": str(os.cpu_count() or 1), "pods": "110"},
                           "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                           "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}}
        if await self.kube.get("Node", None, self.node_name) is None:
            await self.kube.create(node)
            await self.kube.patch("Node", None, self.node_name, {"status": node["status"]}, "status")


def _uid(obj: dict) -> str:
    return obj["metadata"]["uid"]


def _revision(rs: dict) -> int:
    return int((rs["metadata"].get("annotations") or {}).get(ctl.REVISION, 0))


def _counts(rs: dict, by_owner: dict[str, list[dict]]) -> tuple[int, int, int]:
    pods = by_owner[_uid(rs)]
    ready = sum(map(ctl.is_ready, pods))
    return rs["spec"].get("replicas", 0), ready, len(pods) - ready


def _ports_of(pods: list[dict]) -> set[int]:
    ports: set[int] = set()
    for pod in pods:
        raw = (pod["metadata"].get("annotations") or {}).get(PORTS_ANNOTATION)
        if raw:
            ports |= set(json.loads(raw).values())
    return ports
