"""Engine pods as the API reports them: which serve (Ready, `status.podIP`, the container's port) and
which wait for a node (Pending, `PodScheduled=False/Unschedulable`).

Pure: a Pod object (plain dict) in, an `EnginePod` out. The same reading runs on a cluster and on the
local fleet, whose node agent gives each pod its own loopback address and the engine its container
port; nothing here knows which one it is.
"""
from __future__ import annotations

from dataclasses import dataclass

from specfleet.operator.render import INSTANCE_LABEL

HTTP_PORT_NAME = "http"


@dataclass(frozen=True)
class EnginePod:
    namespace: str
    service: str                  # the InferenceService it belongs to (label specfleet.io/inferenceservice)
    name: str
    url: str | None               # http://podIP:containerPort while Ready; None otherwise
    unschedulable: str | None     # the scheduler's message while no node has room; None otherwise


def engine_pod(pod: dict) -> EnginePod | None:
    """The pod as the control loop sees it; None for a pod of no InferenceService or one being deleted."""
    meta = pod.get("metadata") or {}
    service = (meta.get("labels") or {}).get(INSTANCE_LABEL)
    if not service or meta.get("deletionTimestamp"):
        return None
    status = pod.get("status") or {}
    ip, port = status.get("podIP"), container_port(pod)
    url = f"http://{ip}:{port}" if _ready(status) and ip and port else None
    return EnginePod(meta.get("namespace", ""), service, meta.get("name", ""), url, _unschedulable(status))


def container_port(pod: dict) -> int | None:
    """The engine's port from the pod spec: the container port named `http`, else the first one."""
    ports = [p for c in (pod.get("spec") or {}).get("containers") or [] for p in c.get("ports") or []
             if isinstance(p.get("containerPort"), int)]
    named = [p for p in ports if p.get("name") == HTTP_PORT_NAME]
    return (named or ports or [{}])[0].get("containerPort")


def endpoints(pods) -> dict[str, str]:
    """`{pod name: base URL}` of the serving pods among `pods`."""
    return {p.name: p.url for p in pods if p.url}


def unschedulable(pods) -> list[EnginePod]:
    return [p for p in pods if p.unschedulable is not None]


def _ready(status: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def _unschedulable(status: dict) -> str | None:
    if status.get("phase") not in (None, "Pending"):
        return None
    for c in status.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
            return c.get("message") or "no node has room for the pod"
    return None


class EngineView:
    """The engine pods and Deployment replica counts of every service, as the watch streams report them
    (the handlers feed it from kopf's Pod and Deployment events), so a control step reads no API."""

    def __init__(self) -> None:
        self._pods: dict[tuple[str, str], dict[str, EnginePod]] = {}
        self._owner: dict[tuple[str, str], tuple[str, str]] = {}      # (ns, pod) -> (ns, service)
        self._replicas: dict[tuple[str, str], tuple[int, int]] = {}

    def pod_changed(self, pod: dict, gone: bool = False) -> None:
        meta = pod.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        owner = self._owner.pop(key, None)
        if owner is not None:
            self._pods.get(owner, {}).pop(key[1], None)
            if not self._pods.get(owner):
                self._pods.pop(owner, None)
        found = None if gone else engine_pod(pod)
        if found is not None:
            service = (found.namespace, found.service)
            self._pods.setdefault(service, {})[found.name] = found
            self._owner[key] = service

    def replicas_changed(self, namespace: str, name: str, replicas: tuple[int, int] | None) -> None:
        if replicas is None:
            self._replicas.pop((namespace, name), None)
        else:
            self._replicas[(namespace, name)] = replicas

    def pods(self, namespace: str, service: str) -> list[EnginePod]:
        return list(self._pods.get((namespace, service), {}).values())

    def replicas(self, namespace: str, name: str) -> tuple[int, int] | None:
        """(spec.replicas, readyReplicas) of the service's Deployment; None before it exists."""
        return self._replicas.get((namespace, name))
