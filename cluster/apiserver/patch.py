"""Patch formats: JSON merge patch (RFC 7386) and JSON patch (RFC 6902) by maintained libraries, and the
strategic merge patch of built-in kinds, which has no Python implementation to lean on."""
from __future__ import annotations

import copy
import json
from typing import Any

import json_merge_patch
import jsonpatch
import jsonpointer

from specfleet.cluster.apiserver.builtin_schema import resolve
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


# ---------------------------------------------------------------- JSON merge patch and JSON patch
def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, by `json-merge-patch` (which merges in place: it gets copies, never a stored object)."""
    return json_merge_patch.merge(copy.deepcopy(target), copy.deepcopy(patch))


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902, by `jsonpatch`; a malformed patch or a failed operation is a 422."""
    if not isinstance(ops, list):
        raise invalid_patch("a JSON patch must be a list of operations")
    try:
        return jsonpatch.apply_patch(doc, ops)            # works on a deep copy
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
        raise invalid_patch(str(exc)) from None
    except (TypeError, AttributeError, KeyError, IndexError, ValueError) as exc:
        raise invalid_patch(f"invalid JSON patch: {exc}") from None


# ---------------------------------------------------------------- strategic merge patch
def child_property(schema: dict[str, Any] | None, key: str) -> dict[str, Any] | None:
    """The property schema of `key` as the definitions declare it (with its patch extensions, maybe a $ref)."""
    if not schema:
        return None
    extra = schema.get("additionalProperties")
    return (schema.get("properties") or {}).get(key) or (extra if isinstance(extra, dict) else None)


def resolved(prop: dict[str, Any] | None) -> dict[str, Any] | None:
    return resolve(prop)[1] if prop else None


def list_rule(field: str, prop: dict[str, Any] | None, items: list[Any]) -> tuple[bool, str | None]:
    """(merge?, merge key): from the definition's x-kubernetes-patch-strategy/-merge-key when the field is
    known, else from the table of the list fields the project touches."""
    if prop is not None:
        merge = "merge" in (prop.get("x-kubernetes-patch-strategy") or "").split(",")
        return merge, prop.get("x-kubernetes-patch-merge-key")
    if field in SET_LISTS:
        return True, None
    key = merge_key(field, items)
    return key is not None, key


def strategic_merge(original: Any, patch: Any, schema: dict[str, Any] | None = None) -> Any:
    """Strategic merge patch of a built-in object: lists merge as the kind's definition says (item by item on
    the merge key, or as a set of primitives), directives honoured. `schema`: the kind's definition."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    result = dict(original) if isinstance(original, dict) else {}
    if "$retainKeys" in patch:
        result = {k: v for k, v in result.items() if k in patch["$retainKeys"]}
    for key, value in patch.items():
        prop = child_property(schema, key)
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            result[field] = [v for v in result.get(field) or [] if v not in value]
        elif key.startswith("$"):
            continue
        elif value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            if value.get("$patch") == "delete":
                result.pop(key, None)
            else:
                result[key] = strategic_merge(result.get(key), value, resolved(prop))
        elif isinstance(value, list):
            result[key] = merge_list(key, result.get(key), value, prop)
        else:
            result[key] = value
    for key, order in patch.items():
        field = key.split("/", 1)[1] if key.startswith("$setElementOrder/") else None
        if field and isinstance(result.get(field), list):
            result[field] = reorder(result[field], order, list_rule(field, child_property(schema, field),
                                                                   result[field])[1])
    return result


def merge_list(field: str, original: Any, patch: list[Any], prop: dict[str, Any] | None = None) -> list[Any]:
    original = list(original) if isinstance(original, list) else []
    if any(isinstance(i, dict) and i.get("$patch") == "replace" for i in patch):
        return [i for i in patch if not (isinstance(i, dict) and "$patch" in i)]
    merge, key = list_rule(field, prop, original + patch)
    if not merge:
        return copy.deepcopy(patch)
    if key is None:
        return original + [v for v in patch if v not in original]
    if not all(isinstance(i, dict) for i in patch):
        return copy.deepcopy(patch)
    item_schema = resolved((prop or {}).get("items"))
    for item in patch:
        index = next((n for n, o in enumerate(original) if isinstance(o, dict) and o.get(key) == item.get(key)), None)
        if item.get("$patch") == "delete":
            original = [o for o in original if not (isinstance(o, dict) and o.get(key) == item.get(key))]
        elif index is None:
            original.append(strategic_merge({}, item, item_schema))
        else:
            original[index] = strategic_merge(original[index], item, item_schema)
    return original


def reorder(items: list[Any], order: list[Any], key: str | None) -> list[Any]:
    ident = (lambda i: i.get(key) if isinstance(i, dict) else i) if key else (lambda i: json.dumps(i))
    wanted = [ident(o) for o in order]
    ranked = sorted(range(len(items)), key=lambda n: (wanted.index(ident(items[n])) if ident(items[n]) in wanted
                                                      else len(wanted) + n))
    return [items[n] for n in ranked]
