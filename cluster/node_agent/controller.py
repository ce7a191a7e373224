"""The controller half of the node agent: what kube-controller-manager does for Deployments.

One ReplicaSet per pod-template hash, owned by its Deployment; a rolling update (maxSurge /
maxUnavailable, defaults 1 / 0 as the operator renders them) starts new pods, waits for them to be
Ready, then scales old ReplicaSets down. Each ReplicaSet keeps its number of Pods; on scale-down it deletes
them in the real ReplicaSet controller's order (`deletion_order`): unscheduled, pending and not-ready pods
first, then the lowest `controller.kubernetes.io/pod-deletion-cost`, so the operator can pick which
ready pods go. Pods are created as the template says, unbound: the scheduler (`scheduling.py`) binds
them to the node, the kubelet gives each its own address (`addresses.py`). The pure arithmetic comes
first; `DeploymentController` applies it through the API.
"""
from __future__ import annotations

import collections
import copy
import hashlib
import json
import math
import secrets
from dataclasses import dataclass
from typing import Callable

from specfleet.cluster.api_client import ApiClient
from specfleet.cluster.node_agent.kubelet import now_iso

HASH_LABEL = "pod-template-hash"
REVISION = "deployment.kubernetes.io/revision"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
PHASE_RANK = {"Pending": 0, "Unknown": 1, "Running": 2}


def template_hash(template: dict) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def controller_uid(obj: dict) -> str | None:
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return ref.get("uid")
    return None


def is_ready(pod: dict) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def owner_ref(obj: dict) -> dict:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def _int_or_percent(value, total: int, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        share = total * float(value[:-1]) / 100
        return math.ceil(share) if round_up else math.floor(share)
    return int(value)


def rollout_limits(deployment: dict, desired: int) -> tuple[int, int]:
    """(maxSurge, maxUnavailable) as pod counts; Recreate is (0, all)."""
    strategy = deployment["spec"].get("strategy") or {}
    if strategy.get("type") == "Recreate":
        return 0, desired
    rolling = strategy.get("rollingUpdate") or {}
    surge = _int_or_percent(rolling.get("maxSurge", "25%"), desired, True)
    unavailable = _int_or_percent(rolling.get("maxUnavailable", "25%"), desired, False)
    if surge == 0 and unavailable == 0:
        surge = 1
    return surge, unavailable


def scale_plan(desired: int, surge: int, unavailable: int, new: tuple[int, int],
               olds: list[tuple[int, int, int]]) -> tuple[int, list[int]]:
    """Target replicas of the new ReplicaSet and of each old one.

    new = (replicas, ready); olds = [(replicas, ready, not_ready)] oldest first. Not-ready old pods go at
    once; ready ones only while at least `desired - unavailable` pods stay ready.
    """
    if not olds:
        return desired, []
    old_total = sum(r for r, _, _ in olds)
    new_target = min(desired, max(new[0], desired + surge - old_total))
    ready_total = new[1] + sum(ready for _, ready, _ in olds)
    removable = max(0, ready_total - (desired - unavailable))
    targets = []
    for replicas, ready, not_ready in olds:
        drop = min(replicas, not_ready + min(removable, ready))
        removable -= max(0, drop - not_ready)
        targets.append(replicas - drop)
    return new_target, targets


def deletion_cost(pod: dict) -> int:
    """The pod's deletion cost annotation (int32; absent or malformed: 0, as the API server would
    refuse a malformed one)."""
    try:
        return int((pod["metadata"].get("annotations") or {}).get(DELETION_COST, 0))
    except ValueError:
        return 0


def _ready_since(pod: dict) -> str:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready" and condition.get("status") == "True":
            return condition.get("lastTransitionTime") or ""
    return ""


def deletion_order(pods: list[dict]) -> list[dict]:
    """Pods in the order a scale-down deletes them, as the ReplicaSet controller ranks them: unscheduled
    before scheduled; Pending before Unknown before Running; not ready before ready; lower deletion
    cost first; ready for less time first; more container restarts first; newer first."""
    def rank(pod: dict):
        status = pod.get("status") or {}
        restarts = sum(c.get("restartCount", 0) for c in status.get("containerStatuses") or [])
        return (bool(pod["spec"].get("nodeName")), PHASE_RANK.get(status.get("phase", "Pending"), 0),
                is_ready(pod), deletion_cost(pod), _descending(_ready_since(pod)), -restarts,
                _descending(pod["metadata"].get("creationTimestamp", "")))
    return sorted(pods, key=rank)


def _descending(timestamp: str) -> tuple[int, ...]:
    """A sort key that puts later RFC 3339 timestamps first."""
    return tuple(-ord(ch) for ch in timestamp)


def pod_for(rs: dict) -> dict:
    """A new Pod of a ReplicaSet: its template, owned by it, not yet bound to a node."""
    template = copy.deepcopy(rs["spec"]["template"])
    meta = template.get("metadata") or {}
    name = f"{rs['metadata']['name']}-{secrets.token_hex(3)[:5]}"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": rs["metadata"]["namespace"], "labels": meta.get("labels") or {},
                         "annotations": meta.get("annotations") or {}, "ownerReferences": [owner_ref(rs)]},
            "spec": template["spec"]}


def replica_set_for(deployment: dict, digest: str, revision: int) -> dict:
    meta, spec = deployment["metadata"], deployment["spec"]
    template = copy.deepcopy(spec["template"])
    labels = {**(template.get("metadata") or {}).get("labels", {}), HASH_LABEL: digest}
    template.setdefault("metadata", {})["labels"] = labels
    selector = copy.deepcopy(spec.get("selector") or {"matchLabels": {}})
    selector.setdefault("matchLabels", {})[HASH_LABEL] = digest
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": f"{meta['name']}-{digest}", "namespace": meta["namespace"], "labels": labels,
                         "annotations": {REVISION: str(revision)}, "ownerReferences": [owner_ref(deployment)]},
            "spec": {"replicas": 0, "selector": selector, "template": template}}


def deployment_status(deployment: dict, desired: int, total: int, updated: int, ready: int,
                      old: dict | None) -> dict:
    unavailable_ok = rollout_limits(deployment, desired)[1]
    available = ready >= desired - unavailable_ok
    done = updated == desired and total == desired and ready >= desired
    previous = {c["type"]: c for c in (old or {}).get("conditions") or []}

    def condition(kind: str, ok: bool, reason: str, message: str) -> dict:
        value = "True" if ok else "False"
        before = previous.get(kind)
        since = before["lastTransitionTime"] if before and before.get("status") == value else now_iso()
        return {"type": kind, "status": value, "reason": reason, "message": message,
                "lastTransitionTime": since, "lastUpdateTime": since}

    name = deployment["metadata"]["name"]
    conditions = [condition("Available", available, "MinimumReplicasAvailable" if available
                            else "MinimumReplicasUnavailable", f"{ready}/{desired} replicas ready"),
                  condition("Progressing", True, "NewReplicaSetAvailable" if done else "ReplicaSetUpdated",
                            f'ReplicaSet of "{name}" ' + ("has successfully progressed" if done else "is progressing"))]
    return {"observedGeneration": deployment["metadata"].get("generation", 1), "replicas": total,
            "updatedReplicas": updated, "readyReplicas": ready, "availableReplicas": ready,
            "unavailableReplicas": max(0, desired - ready), "conditions": conditions}


def same_status(a: dict | None, b: dict) -> bool:
    def strip(s):
        s = dict(s or {})
        s["conditions"] = [{k: v for k, v in c.items() if k not in ("lastTransitionTime", "lastUpdateTime")}
                           for c in s.get("conditions") or []]
        return s
    return strip(a) == strip(b)


@dataclass
class DeploymentController:
    """Keeps ReplicaSets and Pods in line with every Deployment, one pass per `sync`."""

    api: ApiClient
    event: Callable[[str], None]

    async def sync(self, deployments: list[dict], replica_sets: list[dict], pods: list[dict]) -> None:
        by_owner: dict[str, list[dict]] = collections.defaultdict(list)
        for pod in pods:
            if not pod["metadata"].get("deletionTimestamp"):
                by_owner[controller_uid(pod)].append(pod)
        owned = set()
        for deployment in deployments:
            if not deployment["metadata"].get("deletionTimestamp"):
                for rs in await self._sync_deployment(deployment, replica_sets, by_owner):
                    owned.add(_uid(rs))
                    await self._sync_replica_set(rs, by_owner[_uid(rs)])
        for rs in replica_sets:
            if _uid(rs) not in owned and not rs["metadata"].get("deletionTimestamp"):
                await self._sync_replica_set(rs, by_owner[_uid(rs)])

    async def _sync_deployment(self, deployment: dict, replica_sets: list[dict],
                               by_owner: dict[str, list[dict]]) -> list[dict]:
        uid, spec = deployment["metadata"]["uid"], deployment["spec"]
        digest = template_hash(spec["template"])
        mine = sorted((rs for rs in replica_sets if controller_uid(rs) == uid), key=_revision)
        new = next((rs for rs in mine if rs["metadata"].get("labels", {}).get(HASH_LABEL) == digest), None)
        if new is None:
            new = await self.api.create(replica_set_for(deployment, digest, _revision(mine[-1]) + 1 if mine else 1))
            self.event(f"{deployment['metadata']['name']}: new ReplicaSet {new['metadata']['name']}")
            mine.append(new)
        olds = [rs for rs in mine if rs is not new and (rs["spec"].get("replicas", 0) or by_owner[_uid(rs)])]
        desired = spec.get("replicas", 1)
        surge, unavailable = rollout_limits(deployment, desired)
        new_target, old_targets = scale_plan(desired, surge, unavailable, _counts(new, by_owner)[:2],
                                             [_counts(rs, by_owner) for rs in olds])
        for rs, target in [(new, new_target), *zip(olds, old_targets)]:
            if rs["spec"].get("replicas", 0) != target:
                rs = await self.api.patch("ReplicaSet", rs["metadata"]["namespace"], rs["metadata"]["name"],
                                          {"spec": {"replicas": target}})
                mine = [rs if _uid(m) == _uid(rs) else m for m in mine]
        pods = [p for rs in mine for p in by_owner[_uid(rs)]]
        status = deployment_status(deployment, desired, len(pods), len(by_owner[_uid(new)]),
                                   sum(map(is_ready, pods)), deployment.get("status"))
        if not same_status(deployment.get("status"), status):
            await self.api.patch("Deployment", deployment["metadata"]["namespace"], deployment["metadata"]["name"],
                                 {"status": status}, "status")
        return mine

    async def _sync_replica_set(self, rs: dict, pods: list[dict]) -> None:
        want, namespace = rs["spec"].get("replicas", 1), rs["metadata"]["namespace"]
        for _ in range(want - len(pods)):
            pod = await self.api.create(pod_for(rs))
            self.event(f"{namespace}/{pod['metadata']['name']}: created")
        if len(pods) > want:
            for pod in deletion_order(pods)[:len(pods) - want]:
                await self.api.delete("Pod", namespace, pod["metadata"]["name"])
                self.event(f"{namespace}/{pod['metadata']['name']}: deleted (scale down)")
        ready = sum(map(is_ready, pods))
        status = {"replicas": len(pods), "fullyLabeledReplicas": len(pods), "readyReplicas": ready,
                  "availableReplicas": ready, "observedGeneration": rs["metadata"].get("generation", 1)}
        if any((rs.get("status") or {}).get(k) != v for k, v in status.items()):
            await self.api.patch("ReplicaSet", namespace, rs["metadata"]["name"], {"status": status}, "status")


def _uid(obj: dict) -> str:
    return obj["metadata"]["uid"]


def _revision(rs: dict) -> int:
    return int((rs["metadata"].get("annotations") or {}).get(REVISION, 0))


def _counts(rs: dict, by_owner: dict[str, list[dict]]) -> tuple[int, int, int]:
    pods = by_owner[_uid(rs)]
    ready = sum(map(is_ready, pods))
    return rs["spec"].get("replicas", 0), ready, len(pods) - ready
