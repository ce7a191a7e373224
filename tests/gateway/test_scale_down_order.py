"""The emulator's ReplicaSet scale-down deletes pods in the real controller's order, so the operator's
`controller.kubernetes.io/pod-deletion-cost` decides which ready pods go."""
from __future__ import annotations

from dataclasses import dataclass, field

from specfleet.cluster.node_agent.controller import DELETION_COST, DeploymentController, deletion_order


def _pod(name: str, cost: int | None = None, ready: bool = True, node: str | None = "local",
         phase: str = "Running", created: str = "2026-01-01T00:00:00Z", ready_at: str = "2026-01-01T00:00:10Z",
         restarts: int = 0) -> dict:
    annotations = {} if cost is None else {DELETION_COST: str(cost)}
    return {"metadata": {"name": name, "namespace": "default", "uid": name, "annotations": annotations,
                         "creationTimestamp": created, "ownerReferences": [{"uid": "rs", "controller": True}]},
            "spec": {"nodeName": node} if node else {},
            "status": {"phase": phase, "containerStatuses": [{"restartCount": restarts}],
                       "conditions": [{"type": "Ready", "status": str(ready), "lastTransitionTime": ready_at}]}}


def _names(pods: list[dict]) -> list[str]:
    return [p["metadata"]["name"] for p in deletion_order(pods)]


def test_the_lowest_deletion_cost_goes_first_among_ready_pods():
    assert _names([_pod("busy", 100), _pod("idle", -5), _pod("plain")]) == ["idle", "plain", "busy"]


def test_unscheduled_pending_and_not_ready_pods_go_before_any_cost_is_considered():
    pods = [_pod("cheap", -100), _pod("unready", 50, ready=False), _pod("pending", 50, ready=False, phase="Pending"),
            _pod("unbound", 50, ready=False, node=None, phase="Pending")]
    assert _names(pods) == ["unbound", "pending", "unready", "cheap"]


def test_at_equal_cost_the_pod_ready_for_less_time_then_the_newest_goes_first():
    pods = [_pod("old-ready", ready_at="2026-01-01T00:00:10Z"), _pod("new-ready", ready_at="2026-01-01T00:05:00Z")]
    assert _names(pods) == ["new-ready", "old-ready"]
    pods = [_pod("older", created="2026-01-01T00:00:00Z"), _pod("newer", created="2026-01-01T00:01:00Z")]
    assert _names(pods) == ["newer", "older"]
    assert _names([_pod("stable"), _pod("crashy", restarts=3)]) == ["crashy", "stable"]


def test_a_malformed_cost_counts_as_zero():
    bad = _pod("bad", created="2026-01-01T00:00:00Z")
    bad["metadata"]["annotations"][DELETION_COST] = "not-a-number"
    assert _names([_pod("pos", 1, created="2026-01-01T00:09:00Z"), bad, _pod("neg", -1)]) == ["neg", "bad", "pos"]


@dataclass
class ScaleDownRecorder:
    deleted: list[str] = field(default_factory=list)

    async def delete(self, kind, namespace, name):
        self.deleted.append(name)

    async def patch(self, *args, **kwargs):
        return {}

    async def create(self, obj):
        raise AssertionError("a scale-down creates nothing")


async def test_scaling_a_replica_set_from_three_to_one_deletes_the_two_cheapest_pods():
    api = ScaleDownRecorder()
    controller = DeploymentController(api, lambda message: None)
    rs = {"metadata": {"name": "rs", "namespace": "default", "uid": "rs"}, "spec": {"replicas": 1}, "status": {}}
    await controller._sync_replica_set(rs, [_pod("keep", 10), _pod("drop-a", -10), _pod("drop-b", 0)])
    assert api.deleted == ["drop-a", "drop-b"]
