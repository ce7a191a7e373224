"""`Table` responses (`Accept: application/json;as=Table;g=meta.k8s.io;v=v1`), as `kubectl get` asks for:
CRD printer columns evaluated with a small JSONPath, and Name/Age (plus a few kind columns) for built-ins."""
from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any, Callable

from specfleet.cluster.apiserver.meta import parse_time
from specfleet.cluster.apiserver.registry import ResourceType

NAME_COL = {"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a "
            "namespace.", "priority": 0}
AGE_COL = {"name": "Age", "type": "date", "format": "", "description": "CreationTimestamp", "priority": 0,
           "jsonPath": ".metadata.creationTimestamp"}
BUILTIN_COLUMNS: dict[str, list[tuple[str, str, str]]] = {
    "/pods": [("Status", "string", ".status.phase"), ("Node", "string", ".spec.nodeName")],
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


def column(name: str, kind: str, cell_of: Callable[[dict[str, Any]], Any], priority: int = 0,
           fmt: str = "") -> dict[str, Any]:
    """A column whose cell a function computes (the kinds whose real printers do more than a JSONPath)."""
    return {"name": name, "type": kind, "format": fmt, "description": "", "priority": priority, "cell": cell_of}


def ready_of(obj: dict[str, Any]) -> str:
    return f"{dig(obj, 'status.readyReplicas') or 0}/{dig(obj, 'spec.replicas') or 0}"


def containers_of(obj: dict[str, Any], key: str) -> str:
    return ",".join(str(c.get(key, "")) for c in dig(obj, "spec.template.spec.containers") or [])


def selector_of(obj: dict[str, Any]) -> str:
    labels = dig(obj, "spec.selector.matchLabels") or {}
    return ",".join(f"{k}={v}" for k, v in labels.items()) or "<none>"


def since(stamp: Any) -> str:
    return human_age(stamp) if isinstance(stamp, str) and stamp else "<unknown>"


def event_object(obj: dict[str, Any], ref: str) -> str:
    target = obj.get(ref) or {}
    return f"{str(target.get('kind', '')).lower()}/{target.get('name', '')}"


def event_columns(ref: str, message: str, last: str, source: str) -> list[dict[str, Any]]:
    """The columns of kubectl's event printer (Last Seen, Type, Reason, Object, Message; the rest -o wide)."""
    return [column("Last Seen", "string", lambda o: since(dig(o, last) or dig(o, "eventTime"))),
            column("Type", "string", lambda o: o.get("type", "")),
            column("Reason", "string", lambda o: o.get("reason", "")),
            column("Object", "string", lambda o: event_object(o, ref)),
            column("Subobject", "string", lambda o: dig(o, f"{ref}.fieldPath") or "", 1),
            column("Source", "string", lambda o: dig(o, source) or "", 1),
            column("Message", "string", lambda o: o.get(message, "")),
            column("First Seen", "string", lambda o: since(dig(o, "firstTimestamp") or dig(o, "eventTime")), 1),
            column("Count", "string", lambda o: str(o.get("count") or dig(o, "series.count") or 1), 1),
            column("Name", "string", lambda o: o["metadata"]["name"], 1, "name")]


#: kinds whose `kubectl get` columns are computed, as the real server's printers compute them.
COMPUTED_COLUMNS: dict[str, list[dict[str, Any]]] = {
    "apps/deployments": [
        NAME_COL, column("Ready", "string", ready_of),
        column("Up-to-date", "integer", lambda o: dig(o, "status.updatedReplicas") or 0),
        column("Available", "integer", lambda o: dig(o, "status.availableReplicas") or 0),
        {**AGE_COL}, column("Containers", "string", lambda o: containers_of(o, "name"), 1),
        column("Images", "string", lambda o: containers_of(o, "image"), 1),
        column("Selector", "string", selector_of, 1)],
    "/events": event_columns("involvedObject", "message", "lastTimestamp", "source.component"),
    "events.k8s.io/events": event_columns("regarding", "note", "deprecatedLastTimestamp", "reportingController"),
}


def columns(rt: ResourceType) -> list[dict[str, Any]]:
    if rt.key in COMPUTED_COLUMNS:
        return COMPUTED_COLUMNS[rt.key]
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
    if "cell" in column:
        return column["cell"](obj)
    if column is NAME_COL:
        return obj["metadata"]["name"]
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
    cells = [cell(obj, c) for c in cols]
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
            "columnDefinitions": [{k: v for k, v in c.items() if k not in ("jsonPath", "cell")} for c in cols],
            "rows": [row(rt, obj, include, cols) for obj in objects]}
