"""The node agent's scheduler assigns a pod through `pods/binding`, as a scheduler does on a cluster: a
plain patch of `spec.nodeName` is what the API server (and the emulator) refuses, so there is no fallback
to it, and a refused binding leaves the pod unassigned."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from specfleet.cluster.api_client import ApiCallError
from specfleet.cluster.node_agent.agent import NODE_NAME, NodeAgent


@dataclass
class FakeApi:
    refuse: int | None = None
    calls: list[tuple] = field(default_factory=list)

    async def bind(self, namespace, pod, node, uid=None):
        self.calls.append(("bind", pod, node, uid))
        if self.refuse:
            raise ApiCallError(self.refuse, "refused")

    async def patch(self, kind, namespace, name, patch, sub=None):
        self.calls.append(("patch", name, patch))
        return {}

    async def create(self, obj):
        return obj      # the Scheduled Event


def _pod() -> dict:
    return {"metadata": {"name": "p", "namespace": "default", "uid": "u"}, "spec": {}}


async def _bind(api: FakeApi, tmp_path, pod: dict) -> None:
    agent = NodeAgent("http://unused", tmp_path, allocatable={"cpu": 1000, "memory": 2**30, "pods": 10})
    agent.api = api
    await agent._bind(pod)


async def test_a_pod_is_bound_through_the_binding_subresource_for_its_uid(tmp_path):
    api, pod = FakeApi(), _pod()
    await _bind(api, tmp_path, pod)
    assert api.calls == [("bind", "p", NODE_NAME, "u")] and pod["spec"]["nodeName"] == NODE_NAME


@pytest.mark.parametrize("status", [404, 405, 409])
async def test_a_refused_binding_is_not_replaced_by_a_patch(tmp_path, status):
    api, pod = FakeApi(refuse=status), _pod()
    with pytest.raises(ApiCallError):
        await _bind(api, tmp_path, pod)
    assert api.calls == [("bind", "p", NODE_NAME, "u")] and "nodeName" not in pod["spec"]
