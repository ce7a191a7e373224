"""Scale-down through the node agent: lowering a Deployment's replicas deletes the pods the operator marked
cheapest (`controller.kubernetes.io/pod-deletion-cost`), and a deleted pod's process gets SIGTERM and its
grace period to finish, SIGKILL only after it; the pod stays in the API, terminating, until its process has
ended, when the kubelet deletes it for good."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from specfleet.cluster.api_client import ApiClient
from specfleet.cluster.node_agent.agent import NodeAgent
from specfleet.cluster.node_agent.controller import DELETION_COST
from testkit import local_node, until

# Writes `term` on SIGTERM, then finishes its work for `LINGER` seconds (or ignores SIGTERM: IGNORE=1).
WORKER = [sys.executable, "-c", """
import os, signal, sys, time
out = os.environ['OUT'] + '/' + os.environ['POD']
def term(*_):
    open(out + '.term', 'w').close()
    time.sleep(float(os.environ['LINGER']))
    open(out + '.done', 'w').close()
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if os.environ.get('IGNORE') else term)
open(out + '.up', 'w').close()
while True:
    time.sleep(0.1)
"""]


def deployment(replicas: int, out: Path, grace_s: int, linger_s: float = 0.5, ignore: bool = False) -> dict:
    labels = {"app": "worker"}
    env = [{"name": "OUT", "value": str(out)}, {"name": "LINGER", "value": str(linger_s)},
           {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    if ignore:
        env.append({"name": "IGNORE", "value": "1"})
    container = {"name": "worker", "command": WORKER, "env": env, "resources": {"requests": {"cpu": "10m"}}}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "worker", "namespace": "default"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [container], "terminationGracePeriodSeconds": grace_s}}}}


@pytest.fixture
async def cluster(tmp_path):
    async with local_node(tmp_path / "node") as api:
        yield api


async def _running(api: ApiClient, out: Path, n: int) -> list[str]:
    async def up():
        names = [p["metadata"]["name"] for p in await api.list("Pod")]
        return len(names) == n and all((out / f"{name}.up").exists() for name in names) and names
    return await until(up)


async def test_scaling_down_deletes_the_pods_marked_cheapest(cluster, tmp_path):
    await cluster.create(deployment(3, tmp_path, grace_s=5))
    names = await _running(cluster, tmp_path, 3)
    keep = names[1]
    for name, cost in zip(names, (-10, 100, 0)):
        await cluster.patch("Pod", "default", name, {"metadata": {"annotations": {DELETION_COST: str(cost)}}})
    await cluster.patch("Deployment", "default", "worker", {"spec": {"replicas": 1}})
    assert await _running(cluster, tmp_path, 1) == [keep]


async def test_a_deleted_pod_gets_sigterm_and_its_grace_period_to_finish(cluster, tmp_path):
    await cluster.create(deployment(1, tmp_path, grace_s=10, linger_s=1.5))
    [name] = await _running(cluster, tmp_path, 1)
    await cluster.patch("Deployment", "default", "worker", {"spec": {"replicas": 0}})
    await until(lambda: (tmp_path / f"{name}.term").exists())
    assert await until(lambda: (tmp_path / f"{name}.done").exists())     # not killed while finishing


async def test_a_pod_that_ignores_sigterm_is_killed_after_its_grace_period(cluster, tmp_path):
    await cluster.create(deployment(1, tmp_path, grace_s=1, ignore=True))
    [name] = await _running(cluster, tmp_path, 1)
    pid = int((await cluster.get("Pod", "default", name))["status"]["containerStatuses"][0]["containerID"]
              .removeprefix("local://"))
    await cluster.patch("Deployment", "default", "worker", {"spec": {"replicas": 0}})

    def gone() -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
        except FileNotFoundError:
            return True

    assert await until(gone, timeout=10)


async def test_a_deleted_pod_stays_terminating_until_its_process_has_stopped(cluster, tmp_path):
    await cluster.create(deployment(1, tmp_path, grace_s=10, linger_s=1.5))
    [name] = await _running(cluster, tmp_path, 1)
    await cluster.patch("Deployment", "default", "worker", {"spec": {"replicas": 0}})
    await until(lambda: (tmp_path / f"{name}.term").exists())
    terminating = await cluster.get("Pod", "default", name)
    assert terminating["metadata"]["deletionTimestamp"] and terminating["metadata"]["deletionGracePeriodSeconds"] == 10

    async def gone():
        return await cluster.get("Pod", "default", name) is None
    await until(gone)
    assert (tmp_path / f"{name}.done").exists()          # removed from the API only once its process ended


async def test_the_grace_period_of_the_delete_overrides_the_pod_spec(cluster, tmp_path):
    await cluster.create(deployment(1, tmp_path, grace_s=300, ignore=True))
    [name] = await _running(cluster, tmp_path, 1)
    await cluster.delete("Pod", "default", name, grace_period_s=1)

    async def gone():
        return await cluster.get("Pod", "default", name) is None
    assert await until(gone, timeout=10)           # SIGKILL after 1 s, not the spec's 300


class DeleteRecorder:
    def __init__(self):
        self.deleted: list[tuple] = []

    async def delete(self, kind, namespace, name, grace_period_s=None, uid=None):
        self.deleted.append((kind, name, grace_period_s, uid))


async def test_a_terminating_pod_with_nothing_running_is_deleted_at_once(tmp_path):
    agent = NodeAgent("http://unused", tmp_path, allocatable={"cpu": 1000, "memory": 2**30, "pods": 10})
    agent.api = DeleteRecorder()
    pod = {"metadata": {"name": "p", "namespace": "default", "uid": "u", "deletionTimestamp": "2026-01-01T00:00:00Z",
                        "deletionGracePeriodSeconds": 30},
           "spec": {"nodeName": agent.node_name}, "status": {"phase": "Running"}}
    agent._sync_pods([pod])
    agent._sync_pods([pod])                        # the next tick does not delete it twice
    await asyncio.gather(*agent._retiring)
    assert agent.api.deleted == [("Pod", "p", 0, "u")] and not agent.runners
