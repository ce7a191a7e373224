"""The resource types the server knows: built-in kinds, CRD-registered kinds, and discovery documents."""
from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from typing import Any

ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
SUB_VERBS = ["get", "patch", "update"]


@dataclass(frozen=True)
class ScaleSpec:
    """Where a kind keeps the numbers its /scale subresource shows (dotted JSON paths)."""
    spec_replicas: str = ".spec.replicas"
    status_replicas: str = ".status.replicas"
    selector: str | None = ".spec.selector"
    selector_is_object: bool = True          # built-ins: a LabelSelector; CRs: a string


@dataclass
class ResourceType:
    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool = True
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    status: bool = False
    scale: ScaleSpec | None = None
    generation: bool = True                  # whether metadata.generation is tracked
    builtin: bool = True                     # strategic merge patch applies to built-ins only
    custom: Any = None                       # crd.CustomVersion for CRD-defined kinds

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def key(self) -> str:
        """Storage key: one store per group+plural, shared by every served version."""
        return f"{self.group}/{self.plural}"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return self.kind + "List"

    def discovery(self) -> list[dict[str, Any]]:
        """This kind's entries in an APIResourceList (the resource, then its subresources)."""
        main = {"name": self.plural, "singularName": self.singular, "namespaced": self.namespaced,
                "kind": self.kind, "verbs": ALL_VERBS,
                "storageVersionHash": hashlib.sha256(self.key.encode()).hexdigest()[:12]}
        if self.short_names:
            main["shortNames"] = list(self.short_names)
        if self.categories:
            main["categories"] = list(self.categories)
        out = [main]
        if self.key == "/pods":                  # the scheduler's verb: POST a Binding
            out.append({"name": "pods/binding", "singularName": "", "namespaced": True, "kind": "Binding",
                        "verbs": ["create"]})
        if self.key == "/serviceaccounts":       # the TokenRequest API (`kubectl create token`)
            out.append({"name": "serviceaccounts/token", "singularName": "", "namespaced": True,
                        "group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest",
                        "verbs": ["create"]})
        if self.status:
            out.append({"name": f"{self.plural}/status", "singularName": "", "namespaced": self.namespaced,
                        "kind": self.kind, "verbs": SUB_VERBS})
        if self.scale:
            out.append({"name": f"{self.plural}/scale", "singularName": "", "namespaced": self.namespaced,
                        "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": SUB_VERBS})
        return out


def _t(group: str, version: str, kind: str, plural: str, **kw: Any) -> ResourceType:
    return ResourceType(group, version, kind, plural, **kw)


def builtin_types() -> list[ResourceType]:
    """The built-in kinds the operator and the local fleet use."""
    nogen = {"generation": False}
    workload = ScaleSpec()
    return [
        _t("", "v1", "Namespace", "namespaces", namespaced=False, short_names=("ns",), status=True, **nogen),
        _t("", "v1", "Node", "nodes", namespaced=False, short_names=("no",), status=True, **nogen),
        _t("", "v1", "Pod", "pods", short_names=("po",), categories=("all",), status=True),
        _t("", "v1", "Service", "services", short_names=("svc",), categories=("all",), status=True, **nogen),
        _t("", "v1", "Endpoints", "endpoints", short_names=("ep",), **nogen),
        _t("", "v1", "Event", "events", short_names=("ev",), **nogen),
        _t("", "v1", "ConfigMap", "configmaps", short_names=("cm",), **nogen),
        _t("", "v1", "Secret", "secrets", **nogen),
        _t("", "v1", "ServiceAccount", "serviceaccounts", short_names=("sa",), **nogen),
        _t("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", short_names=("pvc",), status=True, **nogen),
        _t("apps", "v1", "Deployment", "deployments", short_names=("deploy",), categories=("all",),
           status=True, scale=workload),
        _t("apps", "v1", "ReplicaSet", "replicasets", short_names=("rs",), categories=("all",),
           status=True, scale=workload),
        _t("apps", "v1", "StatefulSet", "statefulsets", short_names=("sts",), categories=("all",),
           status=True, scale=workload),
        _t("apps", "v1", "DaemonSet", "daemonsets", short_names=("ds",), categories=("all",), status=True),
        _t("batch", "v1", "Job", "jobs", categories=("all",), status=True),
        _t("autoscaling", "v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers", short_names=("hpa",),
           categories=("all",), status=True),
        _t("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets", short_names=("pdb",), status=True),
        _t("coordination.k8s.io", "v1", "Lease", "leases", **nogen),
        _t("rbac.authorization.k8s.io", "v1", "Role", "roles", **nogen),
        _t("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", **nogen),
        _t("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", namespaced=False, **nogen),
        _t("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", namespaced=False,
           **nogen),
        _t("networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies", short_names=("netpol",)),
        _t("networking.k8s.io", "v1", "Ingress", "ingresses", short_names=("ing",), status=True),
        _t("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions",
           namespaced=False, short_names=("crd", "crds"), status=True),
        _t("events.k8s.io", "v1", "Event", "events", short_names=("ev",), **nogen),
    ]


@dataclass
class Registry:
    """Every served (group, version, plural); thread-safe because CRDs change it at run time."""
    types: dict[tuple[str, str, str], ResourceType] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)

    @classmethod
    def with_builtins(cls) -> "Registry":
        reg = cls()
        for rt in builtin_types():
            reg.add(rt)
        return reg

    def add(self, rt: ResourceType) -> None:
        with self.lock:
            self.types[(rt.group, rt.version, rt.plural)] = rt

    def remove_group_plural(self, group: str, plural: str) -> None:
        with self.lock:
            for key in [k for k in self.types if k[0] == group and k[2] == plural]:
                del self.types[key]

    def get(self, group: str, version: str, plural: str) -> ResourceType | None:
        with self.lock:
            return self.types.get((group, version, plural))

    def by_key(self, key: str) -> ResourceType | None:
        """Any served version of the group/plural `key` (the storage version first when custom)."""
        with self.lock:
            matches = [rt for rt in self.types.values() if rt.key == key]
        stored = [rt for rt in matches if rt.custom is not None and rt.custom.storage]
        return (stored or matches or [None])[0]

    def group_versions(self) -> dict[str, list[str]]:
        """group -> served versions, preferred first (custom versions keep their CRD order)."""
        out: dict[str, list[str]] = {}
        with self.lock:
            for rt in self.types.values():
                versions = out.setdefault(rt.group, [])
                if rt.version not in versions:
                    versions.append(rt.version)
        return out

    def in_group_version(self, group: str, version: str) -> list[ResourceType]:
        with self.lock:
            return [rt for rt in self.types.values() if rt.group == group and rt.version == version]

    def api_versions(self) -> dict[str, Any]:
        return {"kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}

    def api_group(self, group: str) -> dict[str, Any] | None:
        versions = self.group_versions().get(group)
        if not versions or not group:
            return None
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": entries,
                "preferredVersion": entries[0]}

    def api_group_list(self) -> dict[str, Any]:
        groups = [self.api_group(g) for g in self.group_versions() if g]
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    def resource_list(self, group: str, version: str) -> dict[str, Any] | None:
        types = self.in_group_version(group, version)
        if not types:
            return None
        resources = [entry for rt in types for entry in rt.discovery()]
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version, "resources": resources}
