"""The node agent against the API emulator, with plain local processes as containers: each pod serves on
its own loopback address at the template's container port (what the gateway and the operator read:
`status.podIP:containerPort`), and pods are admitted by their resource requests, a pod that does not fit
staying Pending (Unschedulable, with an Event) until capacity frees up."""
from __future__ import annotations

import asyncio
import sys
import urllib.request

import pytest

from specfleet.cluster.api_client import ApiClient, Informer
from specfleet.cluster.apiserver.server import ApiServer, ServerConfig
from specfleet.cluster.node_agent.agent import NODE_NAME
from testkit import local_node, until

SERVER = [sys.executable, "-c", "import http.server, os; http.server.HTTPServer((os.environ['POD_IP'], 8000), "
                                "http.server.SimpleHTTPRequestHandler).serve_forever()"]


def deployment(replicas: int, cpu: str) -> dict:
    labels = {"app": "web"}
    container = {"name": "web", "command": SERVER, "ports": [{"name": "http", "containerPort": 8000}],
                 "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                 "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}},
                 "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1}}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "default"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [container], "terminationGracePeriodSeconds": 2}}}}


@pytest.fixture
async def cluster(tmp_path):
    async with local_node(tmp_path) as api:
        yield api


def ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in (pod.get("status") or {}).get("conditions", []))


def get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status


async def test_each_pod_serves_on_its_own_address_at_the_container_port(cluster):
    await cluster.create({**deployment(2, "100m")})

    async def two_ready():
        pods = await cluster.list("Pod")
        return len(pods) == 2 and all(map(ready, pods)) and pods

    pods = await until(two_ready)
    ips = {p["status"]["podIP"] for p in pods}
    assert len(ips) == 2 and "127.0.0.1" not in ips and all(ip.startswith("127.") for ip in ips)
    assert all(p["spec"]["containers"][0]["ports"][0]["containerPort"] == 8000 for p in pods)
    assert [await asyncio.to_thread(get, f"http://{ip}:8000/") for ip in sorted(ips)] == [200, 200]


async def test_a_pod_that_does_not_fit_stays_pending_until_capacity_frees_up(cluster):
    async def registered():
        node = await cluster.get("Node", None, NODE_NAME)
        return node and "allocatable" in (node.get("status") or {}) and node

    node = await until(registered)
    assert node["status"]["allocatable"]["cpu"] == "1" and node["status"]["allocatable"]["memory"] == "1048576Ki"
    await cluster.create(deployment(2, "600m"))

    async def one_running_one_pending():
        pods = await cluster.list("Pod")
        running = [p for p in pods if ready(p)]
        pending = [p for p in pods if not p["spec"].get("nodeName") and any(
            c["type"] == "PodScheduled" and c["reason"] == "Unschedulable" for c in p["status"].get("conditions", []))]
        return len(running) == 1 and len(pending) == 1 and (running[0], pending[0])

    running, pending = await until(one_running_one_pending)
    condition = next(c for c in pending["status"]["conditions"] if c["type"] == "PodScheduled")
    assert condition["status"] == "False" and "Insufficient cpu" in condition["message"]
    assert pending["status"]["phase"] == "Pending" and "podIP" not in pending["status"]
    events = [e for e in await cluster.list("Event") if e["involvedObject"]["name"] == pending["metadata"]["name"]]
    assert [e["reason"] for e in events] == ["FailedScheduling"]

    await cluster.delete("Pod", "default", running["metadata"]["name"])

    async def rescheduled():
        pod = await cluster.get("Pod", "default", pending["metadata"]["name"])
        return pod["spec"].get("nodeName") == NODE_NAME and ready(pod) and pod

    pod = await until(rescheduled)
    assert pod["status"]["podIP"].startswith("127.")
    events = await cluster.list("Event")
    assert sorted(e["reason"] for e in events if e["involvedObject"]["name"] == pod["metadata"]["name"]) == \
        ["FailedScheduling", "Scheduled"]


async def test_an_informer_follows_creates_updates_and_deletes_as_they_happen(tmp_path):
    server = ApiServer(ServerConfig(host="127.0.0.1", port=0)).start()
    try:
        async with ApiClient(server.url) as api:
            seen: list[dict] = []
            informer = Informer(api, "ConfigMap")
            follow = asyncio.create_task(informer.run(lambda: seen.append(
                {name: obj.get("data") for (_, name), obj in informer.objects.items()})))
            config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "default"}}
            await until(lambda: asyncio.sleep(0, seen))                 # the first list arrived
            await api.create({**config, "data": {"k": "1"}})
            await api.patch("ConfigMap", "default", "a", {"data": {"k": "2"}})
            await api.delete("ConfigMap", "default", "a")
            await until(lambda: asyncio.sleep(0, seen[-1] == {} and len(seen) >= 4))
            follow.cancel()
            assert seen[:4] == [{}, {"a": {"k": "1"}}, {"a": {"k": "2"}}, {}]
    finally:
        server.stop()
