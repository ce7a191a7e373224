"""Patch formats: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and strategic merge patch."""
from __future__ import annotations

import copy
import json
from typing import Any

from specfleet.cluster.apiserver.errors import ApiError

#: patchMergeKey of the built-in list fields the project touches (by field name).
MERGE_KEYS = {"containers": "name", "initContainers": "name", "ephemeralContainers": "name", "env": "name",
              "volumes": "name", "volumeMounts": "mountPath", "volumeDevices": "devicePath",
              "imagePullSecrets": "name", "hostAliases": "ip", "conditions": "type", "ownerReferences": "uid",
              "topologySpreadConstraints": "topologyKey", "readinessGates": "conditionType"}
#: primitive lists that merge as sets under strategic merge patch.
SET_LISTS = {"finalizers"}


def merge_key(field: str | None, items: list[Any]) -> str | None:
    """The key a built-in list merges on; container ports and service ports differ."""
    if field == "ports":
        return "containerPort" if any(isinstance(i, dict) and "containerPort" in i for i in items) else "port"
    return MERGE_KEYS.get(field or "")


def invalid_patch(message: str) -> ApiError:
    return ApiError(422, "Invalid", f"the server rejected our request due to an error in our request: {message}")


# ---------------------------------------------------------------- JSON merge patch
def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# ---------------------------------------------------------------- JSON patch
def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise invalid_patch(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str]) -> tuple[Any, str]:
    node = doc
    for part in parts[:-1]:
        node = _child(node, part)
    return node, parts[-1]


def _child(node: Any, part: str) -> Any:
    try:
        return node[int(part)] if isinstance(node, list) else node[part]
    except (KeyError, IndexError, ValueError, TypeError):
        raise invalid_patch(f"path component {part!r} not found") from None


def _add(doc: Any, path: str, value: Any) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent, last = _parent(doc, parts)
    if isinstance(parent, list):
        index = len(parent) if last == "-" else int(last)
        if index > len(parent):
            raise invalid_patch(f"index {index} out of range")
        parent.insert(index, value)
    elif isinstance(parent, dict):
        parent[last] = value
    else:
        raise invalid_patch(f"cannot add to {path}")
    return doc


def _remove(doc: Any, path: str) -> Any:
    parent, last = _parent(doc, _pointer(path))
    _child(parent, last)
    if isinstance(parent, list):
        del parent[int(last)]
    else:
        del parent[last]
    return doc


def json_patch(doc: Any, ops: Any) -> Any:
    if not isinstance(ops, list):
        raise invalid_patch("a JSON patch must be a list of operations")
    doc = copy.deepcopy(doc)
    for op in ops:
        kind, path = op.get("op"), op.get("path", "")
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind == "replace":
            doc = _add(_remove(doc, path), path, copy.deepcopy(op.get("value")))
        elif kind in ("move", "copy"):
            value = copy.deepcopy(_resolve(doc, op["from"]))
            if kind == "move":
                doc = _remove(doc, op["from"])
            doc = _add(doc, path, value)
        elif kind == "test":
            if _resolve(doc, path) != op.get("value"):
                raise invalid_patch(f"testing value {path} failed")
        else:
            raise invalid_patch(f"unexpected kind of operation {kind!r}")
    return doc


def _resolve(doc: Any, path: str) -> Any:
    node = doc
    for part in _pointer(path):
        node = _child(node, part)
    return node


# ---------------------------------------------------------------- strategic merge patch
def strategic_merge(original: Any, patch: Any) -> Any:
    """Strategic merge patch of a built-in object: keyed lists merge item by item, directives honoured."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    result = dict(original) if isinstance(original, dict) else {}
    if "$retainKeys" in patch:
        result = {k: v for k, v in result.items() if k in patch["$retainKeys"]}
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            result[field] = [v for v in result.get(field) or [] if v not in value]
        elif key.startswith("$") or key.startswith("$setElementOrder/"):
            continue
        elif value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            if value.get("$patch") == "delete":
                result.pop(key, None)
            else:
                result[key] = strategic_merge(result.get(key), value)
        elif isinstance(value, list):
            result[key] = merge_list(key, result.get(key), value)
        else:
            result[key] = value
    for key, order in patch.items():
        if key.startswith("$setElementOrder/") and isinstance(result.get(key.split("/", 1)[1]), list):
            field = key.split("/", 1)[1]
            result[field] = reorder(field, result[field], order)
    return result


def merge_list(field: str, original: Any, patch: list[Any]) -> list[Any]:
    original = list(original) if isinstance(original, list) else []
    if any(isinstance(i, dict) and i.get("$patch") == "replace" for i in patch):
        return [i for i in patch if not (isinstance(i, dict) and "$patch" in i)]
    if field in SET_LISTS:
        return original + [v for v in patch if v not in original]
    key = merge_key(field, original + patch)
    if key is None or not all(isinstance(i, dict) for i in patch):
        return copy.deepcopy(patch)
    for item in patch:
        index = next((n for n, o in enumerate(original) if isinstance(o, dict) and o.get(key) == item.get(key)), None)
        if item.get("$patch") == "delete":
            original = [o for o in original if not (isinstance(o, dict) and o.get(key) == item.get(key))]
        elif index is None:
            original.append(strategic_merge({}, item))
        else:
            original[index] = strategic_merge(original[index], item)
    return original


def reorder(field: str, items: list[Any], order: list[Any]) -> list[Any]:
    key = merge_key(field, items)
    ident = (lambda i: i.get(key) if isinstance(i, dict) else i) if key else (lambda i: json.dumps(i))
    wanted = [ident(o) for o in order]
    ranked = sorted(range(len(items)), key=lambda n: (wanted.index(ident(items[n])) if ident(items[n]) in wanted
                                                      else len(wanted) + n))
    return [items[n] for n in ranked]
