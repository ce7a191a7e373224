"""Server-side apply and managedFields bookkeeping (field managers, conflicts, `force`)."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from specfleet.cluster.apiserver import fields as fs
from specfleet.cluster.apiserver.errors import ApiError
from specfleet.cluster.apiserver.meta import now
from specfleet.cluster.apiserver.patch import merge_key
from specfleet.cluster.apiserver.registry import ResourceType


@dataclass
class Entry:
    """One managedFields entry: a manager's field set for one operation (and subresource)."""
    manager: str
    operation: str
    api_version: str
    fields: set[fs.Path]
    subresource: str = ""
    time: str = ""

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> "Entry":
        return cls(raw.get("manager", ""), raw.get("operation", "Update"), raw.get("apiVersion", ""),
                   fs.decode(raw.get("fieldsV1") or {}), raw.get("subresource", ""), raw.get("time", ""))

    def dump(self) -> dict[str, Any]:
        out = {"manager": self.manager, "operation": self.operation, "apiVersion": self.api_version,
               "time": self.time or now(), "fieldsType": "FieldsV1", "fieldsV1": fs.encode(self.fields)}
        if self.subresource:
            out["subresource"] = self.subresource
        return out

    def same_owner(self, other: "Entry") -> bool:
        return (self.manager, self.operation, self.subresource) == (other.manager, other.operation,
                                                                     other.subresource)


def entries(obj: dict[str, Any]) -> list[Entry]:
    return [Entry.parse(e) for e in (obj.get("metadata") or {}).get("managedFields") or []]


def store_entries(obj: dict[str, Any], items: list[Entry]) -> None:
    kept = [e.dump() for e in items if e.fields]
    if kept:
        obj.setdefault("metadata", {})["managedFields"] = kept
    else:
        obj.get("metadata", {}).pop("managedFields", None)


def schema_of(rt: ResourceType) -> dict | None:
    return rt.custom.schema if rt.custom else None


def record_update(rt: ResourceType, old: dict[str, Any] | None, new: dict[str, Any], manager: str,
                  subresource: str = "") -> None:
    """A non-apply write: the manager takes the fields it changed; others lose them."""
    schema = schema_of(rt)
    old_fields = fs.object_fields(old or {}, schema, rt.builtin, subresource)
    new_fields = fs.object_fields(new, schema, rt.builtin, subresource)
    changed = {p for p in new_fields if p not in old_fields or fs.get_at(old, p) != fs.get_at(new, p)}
    removed = old_fields - new_fields
    current = entries(old or {}) if old is not None else []
    mine = Entry(manager, "Update", rt.api_version, set(), subresource, now())
    for entry in current:
        if entry.same_owner(mine):
            mine.fields = entry.fields
        else:
            entry.fields -= changed | removed
    mine.fields = (mine.fields - removed) | changed
    if not changed and not removed:
        return store_entries(new, current)
    store_entries(new, [e for e in current if not e.same_owner(mine)] + [mine])


def conflicts(applied_fields: set[fs.Path], applied: dict, live: dict, others: list[Entry]) -> dict[str, list]:
    """manager -> conflicting paths: fields another manager owns whose value the applier would change."""
    out: dict[str, list] = {}
    for entry in others:
        for path in sorted(applied_fields & entry.fields):
            if path[-1] == "." or path[-1].startswith("v:"):
                continue
            if fs.get_at(applied, path) != fs.get_at(live, path):
                out.setdefault(f"{entry.manager}\0{entry.api_version}", []).append(path)
    return out


def conflict_error(rt: ResourceType, name: str, found: dict[str, list]) -> ApiError:
    total = sum(len(p) for p in found.values())
    causes, lines = [], []
    for key, paths in found.items():
        manager, api_version = key.split("\0")
        for path in paths:
            causes.append({"reason": "FieldManagerConflict", "message": f'conflict with "{manager}" using '
                           f'{api_version}', "field": fs.path_string(path)})
            lines.append(f'conflict with "{manager}" using {api_version}: {fs.path_string(path)}')
    text = lines[0] if total == 1 else "\n".join(f"- {line}" for line in lines)
    message = f"Apply failed with {total} conflict{'s' if total > 1 else ''}: {text}"
    return ApiError(409, "Conflict", message, {"causes": causes})          # NewApplyConflict: causes only


def merge_applied(live: Any, applied: Any, field: str | None, schema: dict | None, builtin: bool) -> Any:
    """Merge an apply configuration into the live object (maps recursively, keyed lists by key)."""
    if isinstance(applied, dict) and isinstance(live, dict):
        out = dict(live)
        for key, value in applied.items():
            out[key] = merge_applied(live.get(key), value, key, fs.child_schema(schema, key), builtin)
        return out
    if isinstance(applied, list) and isinstance(live, list):
        kind, keys = fs.list_policy(field, applied + live, schema, builtin)
        if kind == "set":
            return live + [v for v in applied if v not in live]
        if kind == "map":
            return merge_keyed(live, applied, keys, (schema or {}).get("items"), builtin)
    return copy.deepcopy(applied)


def merge_keyed(live: list, applied: list, keys: list[str], schema: dict | None, builtin: bool) -> list:
    out = list(live)
    for item in applied:
        ident = {k: item.get(k) for k in keys}
        index = next((n for n, o in enumerate(out) if isinstance(o, dict) and
                      all(o.get(k) == v for k, v in ident.items())), None)
        if index is None:
            out.append(copy.deepcopy(item))
        else:
            out[index] = merge_applied(out[index], item, None, schema, builtin)
    return out


def server_side_apply(rt: ResourceType, live: dict[str, Any] | None, applied: dict[str, Any], manager: str,
                      force: bool, subresource: str = "") -> dict[str, Any]:
    """The object after `manager` applies `applied`; raises 409 on conflicts unless forced."""
    schema = schema_of(rt)
    applied_fields = fs.object_fields(applied, schema, rt.builtin, subresource)
    me = Entry(manager, "Apply", rt.api_version, applied_fields, subresource, now())
    if live is None:
        result = copy.deepcopy(applied)
        store_entries(result, [me])
        return result
    current = entries(live)
    others = [e for e in current if e.manager != manager]
    found = conflicts(applied_fields, applied, live, others)
    if found and not force:
        raise conflict_error(rt, (live.get("metadata") or {}).get("name", ""), found)
    for entry in others:
        entry.fields -= {p for paths in found.values() for p in paths}
    previous = next((e.fields for e in current if e.same_owner(me)), set())
    result = merge_applied(live, {k: v for k, v in applied.items() if k not in ("apiVersion", "kind")},
                           None, schema, rt.builtin)
    owned_by_others = set().union(*(e.fields for e in others)) if others else set()
    for path in sorted(previous - applied_fields - owned_by_others, key=lambda p: (p[-1] != ".", len(p))):
        fs.remove_at(result, path)
    store_entries(result, [e for e in current if not e.same_owner(me)] + [me])
    return result


__all__ = ["Entry", "record_update", "server_side_apply", "merge_key"]
