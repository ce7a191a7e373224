"""Engine pods as the API reports them (`control/discovery.py`): serving, starting, waiting for a node."""
from __future__ import annotations

from specfleet.operator import render
from specfleet.operator.control import discovery


def pod(name="chat-0", ip="127.0.0.7", port=8123, ready=True, scheduled=None, deleting=False) -> dict:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    if scheduled is not None:
        conditions.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                           "message": scheduled})
    meta = {"name": name, "namespace": "ns", "labels": render.labels("chat")}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta,
            "spec": {"containers": [{"name": "engine", "ports": [{"name": "metrics", "containerPort": 9000},
                                                                 {"name": "http", "containerPort": port}]}]},
            "status": {"phase": "Pending" if scheduled else "Running", "podIP": ip if not scheduled else None,
                       "conditions": conditions}}


def test_a_ready_pod_is_reached_at_its_ip_and_the_containers_http_port():
    found = discovery.engine_pod(pod())
    assert (found.namespace, found.service, found.name) == ("ns", "chat", "chat-0")
    assert found.url == "http://127.0.0.7:8123" and found.unschedulable is None


def test_a_pod_not_ready_yet_serves_nothing():
    assert discovery.endpoints([discovery.engine_pod(pod(ready=False))]) == {}


def test_a_pod_no_node_has_room_for_is_unschedulable_with_the_schedulers_message():
    found = discovery.engine_pod(pod(ready=False, scheduled="0/1 nodes are available: 1 Insufficient cpu."))
    assert found.url is None and found.unschedulable == "0/1 nodes are available: 1 Insufficient cpu."
    assert discovery.unschedulable([found]) == [found]


def test_a_pod_being_deleted_or_of_no_service_is_ignored():
    assert discovery.engine_pod(pod(deleting=True)) is None
    assert discovery.engine_pod({"metadata": {"name": "x", "labels": {}}}) is None


def test_the_first_port_serves_when_none_is_named_http():
    p = pod()
    p["spec"]["containers"][0]["ports"] = [{"containerPort": 9001}]
    assert discovery.engine_pod(p).url == "http://127.0.0.7:9001"
