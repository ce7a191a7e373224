"""Field sets for managedFields: which fields of an object a manager owns, in the `FieldsV1` encoding.

A path is a tuple of elements: `f:name` (map key), `k:{"name":"x"}` (list item by key), `v:"x"` (set member)
and `.` (the list item itself). Lists are keyed by the CRD schema's `x-kubernetes-list-type`/`-map-keys`
for custom kinds and by the strategic-merge keys for built-ins; other lists are atomic.
"""
from __future__ import annotations

import json
from typing import Any

from specfleet.cluster.apiserver.patch import SET_LISTS, merge_key

Path = tuple[str, ...]
MISSING = object()
TRACKED_METADATA = ("labels", "annotations", "finalizers", "ownerReferences")


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def child_schema(schema: dict | None, key: str) -> dict | None:
    if not schema:
        return None
    props = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    return props.get(key) or (extra if isinstance(extra, dict) else None)


def list_policy(field: str | None, items: list[Any], schema: dict | None, builtin: bool) -> tuple[str, list[str]]:
    """("map", keys) | ("set", []) | ("atomic", []) for a list field."""
    if schema is not None and not builtin:
        kind = schema.get("x-kubernetes-list-type", "atomic")
        return kind, list(schema.get("x-kubernetes-list-map-keys") or [])
    if field in SET_LISTS:
        return "set", []
    key = merge_key(field, items)
    if key and all(isinstance(i, dict) for i in items):
        return "map", [key]
    return "atomic", []


def item_element(item: dict[str, Any], keys: list[str]) -> str:
    return "k:" + compact({k: item.get(k) for k in keys if k in item})


def object_fields(obj: dict[str, Any], schema: dict | None, builtin: bool, subresource: str = "") -> set[Path]:
    """The field set an object's content amounts to (status only for /status, never status otherwise)."""
    out: set[Path] = set()
    for key, value in obj.items():
        if key in ("apiVersion", "kind") or (key == "status") != (subresource == "status"):
            continue
        if key == "metadata":
            meta = {k: v for k, v in (value or {}).items() if k in TRACKED_METADATA}
            if meta:
                walk(meta, ("f:metadata",), None, True, out)
            continue
        walk_value(value, ("f:" + key,), key, child_schema(schema, key), builtin, out)
    return out


def walk(value: dict[str, Any], prefix: Path, schema: dict | None, builtin: bool, out: set[Path]) -> None:
    for key, child in value.items():
        walk_value(child, prefix + ("f:" + key,), key, child_schema(schema, key), builtin, out)


def walk_value(value: Any, path: Path, field: str | None, schema: dict | None, builtin: bool,
               out: set[Path]) -> None:
    if isinstance(value, dict) and value:
        walk(value, path, schema, builtin, out)
    elif isinstance(value, list) and value:
        kind, keys = list_policy(field, value, schema, builtin)
        item_schema = (schema or {}).get("items") if schema else None
        if kind == "set":
            out.update(path + ("v:" + compact(v),) for v in value)
        elif kind == "map":
            for item in value:
                element = path + (item_element(item, keys),)
                out.add(element + (".",))
                walk(item, element, item_schema, builtin, out)
        else:
            out.add(path)
    else:
        out.add(path)


def get_at(obj: Any, path: Path) -> Any:
    """The value at a field path, or MISSING."""
    node = obj
    for element in path:
        if element == ".":
            continue
        kind, rest = element[0], element[2:]
        if kind == "f" and isinstance(node, dict) and rest in node:
            node = node[rest]
        elif kind == "k" and isinstance(node, list):
            keys = json.loads(rest)
            node = next((i for i in node if isinstance(i, dict) and all(i.get(k) == v for k, v in keys.items())),
                        MISSING)
        elif kind == "v" and isinstance(node, list):
            node = json.loads(rest) if json.loads(rest) in node else MISSING
        else:
            return MISSING
        if node is MISSING:
            return MISSING
    return node


def remove_at(obj: Any, path: Path) -> None:
    """Delete the field (or list item) at a path, if present."""
    if path and path[-1] == ".":
        path = path[:-1]
    parent = get_at(obj, path[:-1])
    element = path[-1]
    kind, rest = element[0], element[2:]
    if kind == "f" and isinstance(parent, dict):
        parent.pop(rest, None)
    elif kind in ("k", "v") and isinstance(parent, list):
        target = get_at(parent, (element,))
        if target is not MISSING:
            parent.remove(target)


def path_string(path: Path) -> str:
    """`.spec.template.spec.containers[name="app"].image`, as conflict messages print it."""
    out = ""
    for element in path:
        if element == ".":
            continue
        kind, rest = element[0], element[2:]
        if kind == "f":
            out += "." + rest
        elif kind == "k":
            out += "[" + ",".join(f"{k}={json.dumps(v)}" for k, v in json.loads(rest).items()) + "]"
        else:
            out += f"[={rest}]"
    return out


def encode(paths: set[Path]) -> dict[str, Any]:
    """A path set as the nested FieldsV1 JSON."""
    root: dict[str, Any] = {}
    for path in sorted(paths):
        node = root
        for element in path:
            node = node.setdefault(element, {})
    return root


def decode(fields: dict[str, Any], prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    for element, child in (fields or {}).items():
        if child:
            out |= decode(child, prefix + (element,))
        else:
            out.add(prefix + (element,))
    return out
