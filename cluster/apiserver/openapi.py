"""Just enough OpenAPI v3 for kubectl: a path index and, per group-version, PATCH operations that declare
the `fieldValidation` query parameter, so kubectl validates on the server instead of needing schemas."""
from __future__ import annotations

import hashlib
import json
from typing import Any

from specfleet.cluster.apiserver.registry import Registry, ResourceType

PARAM = {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}}


def gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def document(registry: Registry, group: str, version: str) -> dict[str, Any] | None:
    types = registry.in_group_version(group, version)
    if not types:
        return None
    paths = {}
    for rt in types:
        paths[item_path(rt)] = {"patch": operation(rt, "patch"), "put": operation(rt, "replace")}
    schemas = {f"{rt.group or 'core'}.{rt.version}.{rt.kind}": rt.custom.schema
               for rt in types if rt.custom is not None and rt.custom.schema}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.37.0"}, "paths": paths,
            "components": {"schemas": schemas}}


def item_path(rt: ResourceType) -> str:
    prefix = "/" + gv_path(rt.group, rt.version)
    ns = "/namespaces/{namespace}" if rt.namespaced else ""
    return f"{prefix}{ns}/{rt.plural}/{{name}}"


def operation(rt: ResourceType, verb: str) -> dict[str, Any]:
    return {"operationId": f"{verb}{rt.kind}", "parameters": [PARAM],
            "x-kubernetes-action": verb, "responses": {"200": {"description": "OK"}},
            "x-kubernetes-group-version-kind": {"group": rt.group, "version": rt.version, "kind": rt.kind}}


def index(registry: Registry) -> dict[str, Any]:
    paths = {}
    for group, versions in registry.group_versions().items():
        for version in versions:
            doc = document(registry, group, version)
            digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16].upper()
            path = gv_path(group, version)
            paths[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={digest}"}
    return {"paths": paths}
