"""The controller half of the node agent: what kube-controller-manager does for Deployments.

One ReplicaSet per pod-template hash, owned by its Deployment; a rolling update (maxSurge /
maxUnavailable, defaults 1 / 0 as the operator renders them) starts new pods, waits for them to be
Ready, then scales old ReplicaSets down. Each ReplicaSet keeps its number of Pods (not-ready and newest
removed first). Pods are created bound to this node with a local port per container port: the Pod's
`containerPort` *is* the local port (so `status.podIP:containerPort` reaches it, as on a real cluster),
and the annotations `specfleet.io/ports` (container port -> local port of the template) and
`specfleet.io/endpoint` (`http://127.0.0.1:PORT`) say so explicitly.
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
import secrets
import socket

from specfleet.cluster.node_agent.kubelet import ENDPOINT_ANNOTATION, POD_IP, PORTS_ANNOTATION, now_iso

HASH_LABEL = "pod-template-hash"
REVISION = "deployment.kubernetes.io/revision"


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


def free_port(taken: set[int]) -> int:
    while True:
        with socket.socket() as s:
            s.bind((POD_IP, 0))
            port = s.getsockname()[1]
        if port not in taken:
            taken.add(port)
            return port


def pod_for(rs: dict, node: str, taken: set[int]) -> dict:
    """A new Pod of a ReplicaSet, bound to `node`, its container ports replaced by free local ports."""
    template = copy.deepcopy(rs["spec"]["template"])
    meta, spec = template.get("metadata") or {}, template["spec"]
    ports: dict[str, int] = {}
    for container in spec.get("containers") or []:
        for port in container.get("ports") or []:
            local = free_port(taken)
            ports[str(port["containerPort"])] = local
            port["containerPort"] = local
    if not ports:
        ports["8000"] = free_port(taken)
    primary = next(iter(ports.values()))
    annotations = {**(meta.get("annotations") or {}), PORTS_ANNOTATION: json.dumps(ports),
                   ENDPOINT_ANNOTATION: f"http://{POD_IP}:{primary}"}
    if "prometheus.io/port" in annotations:
        annotations["prometheus.io/port"] = str(ports.get(annotations["prometheus.io/port"], primary))
    spec["nodeName"] = node
    name = f"{rs['metadata']['name']}-{secrets.token_hex(3)[:5]}"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": rs["metadata"]["namespace"], "labels": meta.get("labels") or {},
                         "annotations": annotations, "ownerReferences": [owner_ref(rs)]},
            "spec": spec}


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
