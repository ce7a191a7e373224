"""`Table` responses (`Accept: application/json;as=Table;g=meta.k8s.io;v=v1`), as `kubectl get` asks for:
CRD printer columns evaluated with a small JSONPath, and Name/Age (plus a few kind columns) for built-ins."""
from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

from specfleet.cluster.apiserver.meta import parse_time
from specfleet.cluster.apiserver.registry import ResourceType

NAME_COL = {"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a "
            "namespace.", "priority": 0}
AGE_COL = {"name": "Age", "type": "date", "format": "", "description": "CreationTimestamp", "priority": 0,
           "jsonPath": ".metadata.creationTimestamp"}
BUILTIN_COLUMNS: dict[str, list[tuple[str, str, str]]] = {
    "/pods": [("Status", "string", ".status.phase"), ("Node", "string", ".spec.nodeName")],
    "apps/deployments": [("Replicas", "integer", ".spec.replicas"), ("Ready", "integer", ".status.readyReplicas"),
                         ("Available", "integer", ".status.availableReplicas")],
    "apps/replicasets": [("Desired", "integer", ".spec.replicas"), ("Ready", "integer", ".status.readyReplicas")],
    "/namespaces": [("Status", "string", ".status.phase")],
    "/services": [("Type", "string", ".spec.type"), ("Cluster-IP", "string", ".spec.clusterIP")],
    "/configmaps": [],
}
FILTER_RE = re.compile(r"""^\?\(@\.([\w.]+)\s*==\s*['"]([^'"]*)['"]\)$""")
TOKEN_RE = re.compile(r"\.([\w-]+)|\[([^\]]*)\]")


def jsonpath(obj: Any, path: str) -> list[Any]:
    """The values a simple JSONPath (`.a.b`, `[0]`, `[*]`, `[?(@.type=="Ready")]`) selects."""
    path = path.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1]
    nodes = [obj]
    for name, bracket in TOKEN_RE.findall(path.lstrip("$")):
        nodes = [child for node in nodes for child in step(node, name, bracket)]
    return nodes


def step(node: Any, name: str, bracket: str) -> list[Any]:
    if name:
        return [node[name]] if isinstance(node, dict) and name in node else []
    if not isinstance(node, list):
        if isinstance(node, dict) and bracket.strip("'\"") in node:
            return [node[bracket.strip("'\"")]]
        return []
    if bracket == "*":
        return list(node)
    match = FILTER_RE.match(bracket)
    if match:
        key, value = match.groups()
        return [item for item in node if str(dig(item, key)) == value]
    try:
        index = int(bracket)
        return [node[index]] if -len(node) <= index < len(node) else []
    except ValueError:
        return []


def dig(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def columns(rt: ResourceType) -> list[dict[str, Any]]:
    if rt.custom is not None and rt.custom.printer_columns:
        cols = [{"name": c["name"], "type": c.get("type", "string"), "format": c.get("format", ""),
                 "description": c.get("description", ""), "priority": c.get("priority", 0),
                 "jsonPath": c["jsonPath"]} for c in rt.custom.printer_columns]
        return [NAME_COL] + cols
    extra = [{"name": n, "type": t, "format": "", "description": "", "priority": 0, "jsonPath": p}
             for n, t, p in BUILTIN_COLUMNS.get(rt.key, [])]
    return [NAME_COL] + extra + [AGE_COL]


def human_age(stamp: str) -> str:
    """Go's duration.HumanDuration of the time since `stamp`, as kubectl shows ages."""
    try:
        seconds = int((datetime.now(timezone.utc) - parse_time(stamp)).total_seconds())
    except (TypeError, ValueError):
        return "<unknown>"
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if seconds < 0:
        return "<invalid>"
    if seconds < 120:
        return f"{seconds}s"
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if hours < 3:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if days < 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    return f"{days}d" if days < 730 else f"{days // 365}y"


def cell(obj: dict[str, Any], column: dict[str, Any]) -> Any:
    values = jsonpath(obj, column["jsonPath"])
    if not values:
        return None
    if column["type"] == "date" and isinstance(values[0], str):
        return human_age(values[0])
    value = values[0] if len(values) == 1 else ",".join(str(v) for v in values)
    if column["type"] == "string" and not isinstance(value, str):
        return str(value).lower() if isinstance(value, bool) else str(value)
    return value


def row(rt: ResourceType, obj: dict[str, Any], include: str, cols: list[dict[str, Any]]) -> dict[str, Any]:
    cells = [obj["metadata"]["name"]] + [cell(obj, c) for c in cols[1:]]
    out: dict[str, Any] = {"cells": cells}
    if include == "Object":
        out["object"] = obj
    elif include != "None":
        out["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                         "metadata": obj["metadata"]}
    return out


def table(rt: ResourceType, objects: list[dict[str, Any]], list_meta: dict[str, Any] | None = None,
          include: str = "Metadata") -> dict[str, Any]:
    cols = columns(rt)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta or {},
            "columnDefinitions": [{k: v for k, v in c.items() if k != "jsonPath"} for c in cols],
            "rows": [row(rt, obj, include, cols) for obj in objects]}
