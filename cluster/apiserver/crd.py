"""CustomResourceDefinitions: validating a CRD, turning it into served resource types, its status,
and processing custom objects against a version's schema (prune, default, validate)."""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from specfleet.cluster.apiserver import schema as schemas
from specfleet.cluster.apiserver.builtin_schema import report_unknown
from specfleet.cluster.apiserver.crd_schema import schema_causes
from specfleet.cluster.apiserver.errors import Cause, invalid
from specfleet.cluster.apiserver.meta import now
from specfleet.cluster.apiserver.registry import ResourceType, ScaleSpec

CRD_GROUP = "apiextensions.k8s.io"


@dataclass
class CustomVersion:
    """What a served CRD version adds to a resource type."""
    schema: dict[str, Any] | None
    printer_columns: list[dict[str, Any]] = field(default_factory=list)
    selectable_fields: list[str] = field(default_factory=list)
    storage: bool = False


def crd_causes(crd: dict[str, Any]) -> list[Cause]:
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    causes = []
    for key in ("group", "scope"):
        if not spec.get(key):
            causes.append(Cause("FieldValueRequired", "Required value", f"spec.{key}"))
    for key in ("plural", "kind"):
        if not names.get(key):
            causes.append(Cause("FieldValueRequired", "Required value", f"spec.names.{key}"))
    versions = spec.get("versions") or []
    if not versions:
        causes.append(Cause("FieldValueRequired", "Required value", "spec.versions"))
    elif sum(1 for v in versions if v.get("storage")) != 1:
        causes.append(Cause("FieldValueInvalid", "Invalid value: must have exactly one version marked as "
                            "storage version", "spec.versions"))
    strategy = (spec.get("conversion") or {}).get("strategy", "None")
    if strategy != "None":
        causes.append(Cause("FieldValueNotSupported", f'Unsupported value: "{strategy}": supported values: "None" '
                            "(this emulator cannot call conversion webhooks)", "spec.conversion.strategy"))
    for i, version in enumerate(versions):
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        if schema is not None:
            causes += schema_causes(schema, f"spec.versions[{i}].schema.openAPIV3Schema")
    expected = f"{names.get('plural')}.{spec.get('group')}"
    name = (crd.get("metadata") or {}).get("name")
    if not causes and name != expected:
        causes.append(Cause("FieldValueInvalid", f'Invalid value: "{name}": must be spec.names.plural+"."+'
                            "spec.group", "metadata.name"))
    return causes


def validate_crd(crd: dict[str, Any]) -> None:
    causes = crd_causes(crd)
    if causes:
        raise invalid("CustomResourceDefinition", CRD_GROUP, (crd.get("metadata") or {}).get("name", ""), causes)


def scale_spec(sub: dict[str, Any] | None) -> ScaleSpec | None:
    if sub is None:
        return None
    return ScaleSpec(sub.get("specReplicasPath", ".spec.replicas"), sub.get("statusReplicasPath", ".status.replicas"),
                     sub.get("labelSelectorPath"), selector_is_object=False)


def resource_types(crd: dict[str, Any]) -> list[ResourceType]:
    """One ResourceType per served version of the CRD."""
    spec = crd["spec"]
    names = spec["names"]
    out = []
    for version in spec["versions"]:
        if not version.get("served", True):
            continue
        subs = version.get("subresources") or spec.get("subresources") or {}
        custom = CustomVersion(
            schema=(version.get("schema") or spec.get("validation") or {}).get("openAPIV3Schema"),
            printer_columns=version.get("additionalPrinterColumns") or [],
            selectable_fields=[f["jsonPath"] for f in version.get("selectableFields") or []],
            storage=bool(version.get("storage")))
        out.append(ResourceType(spec["group"], version["name"], names["kind"], names["plural"],
                                namespaced=spec.get("scope") == "Namespaced",
                                short_names=tuple(names.get("shortNames") or ()),
                                categories=tuple(names.get("categories") or ()),
                                status="status" in subs, scale=scale_spec(subs.get("scale")),
                                builtin=False, custom=custom))
    return out


def established_status(crd: dict[str, Any]) -> dict[str, Any]:
    """The status a real server reaches once the CRD is accepted and established."""
    stamp = now()
    conditions = [{"type": t, "status": "True", "lastTransitionTime": stamp, "reason": r, "message": m}
                  for t, r, m in (("NamesAccepted", "NoConflicts", "no conflicts found"),
                                  ("Established", "InitialNamesAccepted", "the initial names have been accepted"))]
    storage = [v["name"] for v in crd["spec"]["versions"] if v.get("storage")]
    stored = (crd.get("status") or {}).get("storedVersions") or []
    return {"conditions": conditions, "acceptedNames": copy.deepcopy(crd["spec"]["names"]),
            "storedVersions": sorted(set(stored) | set(storage))}


def process_custom_object(rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None, opts: Any) -> None:
    """Prune unknown fields (warned, or refused under Strict), apply defaults and validate a custom object in
    place (422 on errors)."""
    schema = rt.custom.schema if rt.custom else None
    if not schema:
        return
    report_unknown(rt, schemas.prune(obj, schema, root=True), opts)
    schemas.apply_defaults(obj, schema)
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    old_body = {k: v for k, v in (old or {}).items() if k not in ("apiVersion", "kind", "metadata")}
    root = {**schema, "properties": {k: v for k, v in (schema.get("properties") or {}).items()
                                     if k not in ("apiVersion", "kind", "metadata")}}
    causes = schemas.validate(body, root, "", old_body if old is not None else schemas.MISSING)
    if causes:
        raise invalid(rt.kind, rt.group, (obj.get("metadata") or {}).get("name", ""), causes)
