"""What kube-apiserver checks in a CRD's `openAPIV3Schema` before it accepts the CRD.

The schema must be structural (every node typed, no `$ref`/`additionalItems`/..., `properties` and
`additionalProperties` exclusive, no `uniqueItems`), and every `x-kubernetes-validations` rule must compile
in the Kubernetes CEL environment and fit the cost limits. Field paths and wording are the real server's
(`spec.versions[0].schema.openAPIV3Schema.properties[spec].type: Required value: must not be empty ...`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from specfleet.cluster.apiserver import cel, cel_cost
from specfleet.cluster.apiserver.errors import Cause

TYPES = ("array", "boolean", "integer", "number", "object", "string")
UNSUPPORTED = {"id": "id is not supported", "additionalItems": "additionalItems is not supported",
               "patternProperties": "patternProperties is not supported",
               "definitions": "definitions is not supported", "dependencies": "dependencies is not supported",
               "$ref": "$ref is not supported"}
REASONS = ("FieldValueDuplicate", "FieldValueForbidden", "FieldValueInvalid", "FieldValueRequired")
EMPTY_TYPE = {"root": "must not be empty at the root", "item": "must not be empty for specified array items",
              "field": "must not be empty for specified object fields"}


def required(path: str, detail: str) -> Cause:
    return Cause("FieldValueRequired", f"Required value: {detail}", path)


def forbidden(path: str, detail: str) -> Cause:
    return Cause("FieldValueForbidden", f"Forbidden: {detail}", path)


@dataclass
class SchemaCheck:
    """One walk over a version's schema; `total_cost` sums every rule's estimate for the CRD-wide limit."""
    root: str
    causes: list[Cause] = field(default_factory=list)
    total_cost: int = 0

    def node(self, schema: Any, path: str, level: str) -> None:
        if not isinstance(schema, dict):
            self.causes.append(Cause("FieldValueInvalid", "Invalid value: must be a schema object", path))
            return
        self.structure(schema, path, level)
        self.rules(schema, path)
        for name, child in (schema.get("properties") or {}).items():
            self.node(child, f"{path}.properties[{name}]", "field")
        if isinstance(schema.get("items"), dict):
            self.node(schema["items"], f"{path}.items", "item")
        if isinstance(schema.get("additionalProperties"), dict):
            self.node(schema["additionalProperties"], f"{path}.additionalProperties", "field")

    def structure(self, schema: dict[str, Any], path: str, level: str) -> None:
        kind = schema.get("type")
        untyped_ok = schema.get("x-kubernetes-int-or-string") or schema.get("x-kubernetes-preserve-unknown-fields")
        if kind == "null":
            self.causes.append(forbidden(f"{path}.type", "type cannot be set to null, use nullable as an "
                                                         "alternative"))
        elif kind and kind not in TYPES:
            self.causes.append(Cause("FieldValueNotSupported", f"Unsupported value: {json.dumps(kind)}: supported "
                                     "values: " + ", ".join(f'"{t}"' for t in TYPES), f"{path}.type"))
        elif not kind and not untyped_ok:
            self.causes.append(required(f"{path}.type", EMPTY_TYPE[level]))
        if level == "root" and kind and kind != "object":
            self.causes.append(Cause("FieldValueInvalid", f"Invalid value: {json.dumps(kind)}: must be object at "
                                     "the root", f"{path}.type"))
        for key, detail in UNSUPPORTED.items():
            if key in schema:
                self.causes.append(forbidden(f"{path}.{key}", detail))
        if schema.get("properties") and "additionalProperties" in schema:
            self.causes.append(forbidden(f"{path}.additionalProperties", "additionalProperties and properties "
                                                                         "are mutual exclusive"))
        if schema.get("uniqueItems"):
            self.causes.append(forbidden(f"{path}.uniqueItems", "uniqueItems cannot be set to true since the "
                                                                "runtime complexity becomes quadratic"))
        if isinstance(schema.get("items"), list):
            self.causes.append(forbidden(f"{path}.items", "items must be a schema object and not an array"))
        if kind == "array" and "items" not in schema:
            self.causes.append(required(f"{path}.items", "must be specified"))

    def rules(self, schema: dict[str, Any], path: str) -> None:
        for i, spec in enumerate(schema.get("x-kubernetes-validations") or []):
            where = f"{path}.x-kubernetes-validations[{i}]"
            rule = (spec or {}).get("rule", "")
            if not rule.strip():
                self.causes.append(required(f"{where}.rule", "rule is not specified"))
                continue
            if spec.get("reason") and spec["reason"] not in REASONS:
                self.causes.append(Cause("FieldValueNotSupported", f"Unsupported value: {json.dumps(spec['reason'])}"
                                         ": supported values: " + ", ".join(f'"{r}"' for r in REASONS),
                                         f"{where}.reason"))
            for key in ("rule", "messageExpression"):
                if spec.get(key):
                    self.compiles(spec, key, where)
            cost = cel_cost.estimated_cost(rule, schema)
            self.total_cost += cost
            if cost > cel_cost.STATIC_LIMIT:
                self.causes.append(forbidden(f"{where}.rule", cel_cost.budget_message("estimated rule cost", cost,
                                                                                     cel_cost.STATIC_LIMIT)))

    def compiles(self, spec: dict[str, Any], key: str, where: str) -> None:
        try:
            cel.compile_rule(spec[key])
        except cel.CelCompileError as exc:
            self.causes.append(Cause("FieldValueInvalid", f"Invalid value: {go_rule(spec)}: {exc}", f"{where}.{key}"))


def go_rule(spec: dict[str, Any]) -> str:
    """How the Go server prints the offending ValidationRule value."""
    return (f'apiextensions.ValidationRule{{Rule:{json.dumps(spec.get("rule", ""))}, '
            f'Message:{json.dumps(spec.get("message", ""))}, '
            f'MessageExpression:{json.dumps(spec.get("messageExpression", ""))}, '
            "Reason:(*apiextensions.FieldValueErrorReason)(nil), "
            f'FieldPath:{json.dumps(spec.get("fieldPath", ""))}, OptionalOldSelf:(*bool)(nil)}}')


def schema_causes(schema: Any, path: str) -> list[Cause]:
    """Every reason kube-apiserver would refuse this version's schema."""
    check = SchemaCheck(path)
    check.node(schema, path, "root")
    if check.total_cost > cel_cost.STATIC_CRD_LIMIT:
        check.causes.append(forbidden(path, cel_cost.budget_message(
            "x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema", check.total_cost,
            cel_cost.STATIC_CRD_LIMIT)))
    return check.causes
