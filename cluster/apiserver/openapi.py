"""OpenAPI v3 for kubectl: a path index and, per group-version, PATCH/PUT operations that declare the
`fieldValidation` query parameter (so kubectl validates on the server), and the schemas `kubectl explain`
reads: each kind under `components.schemas` with its `x-kubernetes-group-version-kind`, custom kinds with
the standard `apiVersion`/`kind`/`metadata` properties, built-in kinds from the Kubernetes definitions."""
from __future__ import annotations

import copy
import hashlib
import json
from functools import lru_cache
from typing import Any

from specfleet.cluster.apiserver.builtin_schema import builtin_definitions, definitions, json_type
from specfleet.cluster.apiserver.registry import Registry, ResourceType

PARAM = {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}}
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
STANDARD_FIELDS = {
    "apiVersion": {"type": "string", "description": "APIVersion defines the versioned schema of this "
                   "representation of an object. Servers should convert recognized schemas to the latest internal "
                   "value, and may reject unrecognized values."},
    "kind": {"type": "string", "description": "Kind is a string value representing the REST resource this object "
             "represents. Servers may infer this from the endpoint the client submits requests to."},
    "metadata": {"allOf": [{"$ref": f"#/components/schemas/{OBJECT_META}"}], "description": "Standard object's "
                 "metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/"
                 "api-conventions.md#metadata"}}


def gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


# ---------------------------------------------------------------- schemas
def to_openapi(schema: dict[str, Any]) -> dict[str, Any]:
    """A JSON-schema definition (kubernetes-validate's form) as an OpenAPI v3 component."""
    if isinstance(schema.get("$ref"), str):
        return {"$ref": "#/components/schemas/" + schema["$ref"].rsplit("/", 1)[-1]}
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "properties":
            out[key] = {name: to_openapi(child) for name, child in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = to_openapi(value)
        elif key in ("allOf", "anyOf"):
            out[key] = [to_openapi(child) for child in value]
        elif key == "oneOf":
            out["x-kubernetes-int-or-string"] = True
        elif key == "type":
            out[key] = json_type(schema)
        else:
            out[key] = value
    return out


def references(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"].rsplit("/", 1)[-1]} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(references(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(references(v) for v in node))
    return set()


def closure(names: set[str]) -> dict[str, Any]:
    """These definitions and every definition they refer to, as OpenAPI components."""
    defs, out, todo = definitions(), {}, list(names)
    while todo:
        name = todo.pop()
        if name in out or name not in defs:
            continue
        out[name] = to_openapi(defs[name])
        todo += references(defs[name])
    return out


def custom_component(rt: ResourceType) -> tuple[str, dict[str, Any]]:
    reversed_group = ".".join(reversed(rt.group.split(".")))
    schema = copy.deepcopy(rt.custom.schema)
    schema["properties"] = {**STANDARD_FIELDS, **{k: v for k, v in (schema.get("properties") or {}).items()
                                                  if k not in STANDARD_FIELDS}}
    schema["x-kubernetes-group-version-kind"] = [{"group": rt.group, "version": rt.version, "kind": rt.kind}]
    return f"{reversed_group}.{rt.version}.{rt.kind}", schema


@lru_cache(maxsize=64)
def builtin_components(group: str, version: str, kinds: tuple[str, ...]) -> dict[str, Any]:
    known = builtin_definitions()
    return closure({known[(group, version, k)] for k in kinds if (group, version, k) in known})


@lru_cache(maxsize=1)
def object_meta() -> dict[str, Any]:
    return closure({OBJECT_META})


def components(types: list[ResourceType], group: str, version: str) -> dict[str, Any]:
    kinds = tuple(sorted(rt.kind for rt in types if rt.custom is None))
    out = dict(builtin_components(group, version, kinds))
    for rt in types:
        if rt.custom is not None and rt.custom.schema:
            name, schema = custom_component(rt)
            out[name] = schema
            out.update(object_meta())
    return out


# ---------------------------------------------------------------- documents
def document(registry: Registry, group: str, version: str) -> dict[str, Any] | None:
    types = registry.in_group_version(group, version)
    if not types:
        return None
    paths = {item_path(rt): {"patch": operation(rt, "patch"), "put": operation(rt, "replace")} for rt in types}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.37.0"}, "paths": paths,
            "components": {"schemas": components(types, group, version)}}


def item_path(rt: ResourceType) -> str:
    prefix = "/" + gv_path(rt.group, rt.version)
    ns = "/namespaces/{namespace}" if rt.namespaced else ""
    return f"{prefix}{ns}/{rt.plural}/{{name}}"


def operation(rt: ResourceType, verb: str) -> dict[str, Any]:
    return {"operationId": f"{verb}{rt.kind}", "parameters": [PARAM],
            "x-kubernetes-action": verb, "responses": {"200": {"description": "OK"}},
            "x-kubernetes-group-version-kind": {"group": rt.group, "version": rt.version, "kind": rt.kind}}


def signature(registry: Registry, group: str, version: str) -> str:
    """What a group-version document is made of (its hash changes when a CRD changes, as the real one does)."""
    types = sorted(registry.in_group_version(group, version), key=lambda rt: rt.plural)
    return json.dumps([(rt.kind, rt.plural, rt.custom.schema if rt.custom else None) for rt in types],
                      sort_keys=True)


def index(registry: Registry) -> dict[str, Any]:
    paths = {}
    for group, versions in registry.group_versions().items():
        for version in versions:
            digest = hashlib.sha256(signature(registry, group, version).encode()).hexdigest()[:16].upper()
            path = gv_path(group, version)
            paths[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={digest}"}
    return {"paths": paths}
