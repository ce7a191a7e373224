"""Built-in kinds decoded the way kube-apiserver decodes them: into typed structs.

The schemas are the Kubernetes OpenAPI definitions that the `kubernetes-validate` package ships for the
server version the emulator reports. A field the struct does not have is dropped (a `Warning` header, or
`400 strict decoding error` under `fieldValidation=Strict`); a value of the wrong JSON type is the decoder's
`400 BadRequest` ("cannot unmarshal string into Go struct field DeploymentSpec.spec.replicas of type int32").
Only the kinds the operator and the local fleet write are decoded; see CHECKED.
"""
from __future__ import annotations

import base64
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import kubernetes_validate

from specfleet.cluster.apiserver.errors import ApiError, bad_request

SCHEMA_VERSION = "v1.37.0-local"
#: storage key -> OpenAPI definition of the kinds decoded strictly.
CHECKED = {"apps/deployments": "io.k8s.api.apps.v1.Deployment", "/services": "io.k8s.api.core.v1.Service",
           "policy/poddisruptionbudgets": "io.k8s.api.policy.v1.PodDisruptionBudget",
           "networking.k8s.io/networkpolicies": "io.k8s.api.networking.v1.NetworkPolicy",
           "/secrets": "io.k8s.api.core.v1.Secret", "/configmaps": "io.k8s.api.core.v1.ConfigMap"}
BASE64 = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=")
INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
GO_TYPES = {("integer", "int32"): "int32", ("integer", "int64"): "int64", ("integer", ""): "int",
            ("number", "double"): "float64", ("number", ""): "float64", ("boolean", ""): "bool",
            ("string", ""): "string", ("string", "byte"): "[]uint8", ("string", "date-time"): "v1.Time"}


@lru_cache(maxsize=1)
def definitions() -> dict[str, Any]:
    root = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / SCHEMA_VERSION
    return json.loads((root / "_definitions.json").read_text())["$defs"]


@lru_cache(maxsize=1)
def builtin_definitions() -> dict[tuple[str, str, str], str]:
    """(group, version, kind) -> definition name, from each definition's group-version-kind."""
    out = {}
    for name, schema in definitions().items():
        for gvk in schema.get("x-kubernetes-group-version-kind") or []:
            out[(gvk["group"], gvk["version"], gvk["kind"])] = name
    return out


def kind_definition(rt: Any) -> dict[str, Any] | None:
    """The definition of a built-in kind (None for kinds the definitions do not have)."""
    name = builtin_definitions().get((rt.group, rt.version, rt.kind))
    return definitions()[name] if name else None


def ref_name(schema: dict[str, Any]) -> str | None:
    ref = schema.get("$ref")
    return ref.rsplit("/", 1)[-1] if isinstance(ref, str) else None


def resolve(schema: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """(definition name or None, the schema behind any $ref)."""
    name = ref_name(schema)
    if name is None and schema.get("allOf"):
        name = ref_name(schema["allOf"][0])
    return (name, definitions()[name]) if name else (None, schema)


def json_type(schema: dict[str, Any]) -> str:
    kinds = schema.get("type") or []
    kinds = [kinds] if isinstance(kinds, str) else kinds
    return next((k for k in kinds if k != "null"), "")


def go_type(name: str | None, schema: dict[str, Any]) -> str:
    if name:
        parts = name.split(".")
        return f"{parts[-2]}.{parts[-1]}" if name not in (INT_OR_STRING, QUANTITY) else name
    kind = json_type(schema)
    if kind == "array":
        item_name, item = resolve(schema.get("items") or {})
        return "[]" + go_type(item_name, item)
    if kind == "object":
        value_name, value = resolve(schema.get("additionalProperties") or {})
        return "map[string]" + go_type(value_name, value) if schema.get("additionalProperties") else "object"
    return GO_TYPES.get((kind, schema.get("format", "")), GO_TYPES.get((kind, ""), kind))


def value_kind(value: Any) -> str:
    """How Go's decoder names a JSON value."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), "null")


def fits(value: Any, name: str | None, schema: dict[str, Any]) -> bool:
    if value is None:
        return True
    if name == INT_OR_STRING:
        return isinstance(value, (int, str)) and not isinstance(value, bool)
    if name == QUANTITY:
        return isinstance(value, (int, float, str)) and not isinstance(value, bool)
    kind = json_type(schema)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return {"string": str, "boolean": bool, "array": list, "object": dict}.get(kind, object) is type(value) or \
        kind not in ("string", "boolean", "array", "object")


class Decoder:
    """Walks one object against its definition: drops unknown fields, stops at the first type error."""

    def __init__(self, kind: str, version: str):
        self.kind, self.version = kind, version
        self.unknown: list[str] = []

    def type_error(self, value: Any, struct: str, path: str, name: str | None, schema: dict[str, Any]) -> ApiError:
        return bad_request(f'{self.kind} in version "{self.version}" cannot be handled as a {self.kind}: json: '
                           f"cannot unmarshal {value_kind(value)} into Go struct field {struct}.{path} of type "
                           f"{go_type(name, schema)}")

    def base64(self, value: str) -> None:
        """[]byte fields (Secret data) hold standard base64, as Go's decoder demands."""
        bad = next((i for i, ch in enumerate(value) if ch not in BASE64), None)
        if bad is None and len(value) % 4:
            bad = len(value) - len(value) % 4
        if bad is not None:
            raise bad_request(f'{self.kind} in version "{self.version}" cannot be handled as a {self.kind}: illegal '
                              f"base64 data at input byte {bad}")

    def walk(self, value: Any, schema: dict[str, Any], struct: str, path: str, where: str) -> None:
        """`path` as Go's decoder names fields (no indexes), `where` as warnings name them."""
        name, schema = resolve(schema)
        if not fits(value, name, schema):
            raise self.type_error(value, struct, path, name, schema)
        owner = name.rsplit(".", 1)[-1] if name else struct
        if isinstance(value, str) and schema.get("format") == "byte":
            self.base64(value)
        if isinstance(value, dict) and "properties" in schema:
            self.walk_struct(value, schema["properties"], owner, path, where)
        elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
            for key, item in value.items():
                self.walk(item, schema["additionalProperties"], owner, path, f"{where}[{key}]")
        elif isinstance(value, list) and isinstance(schema.get("items"), dict):
            for i, item in enumerate(value):
                self.walk(item, schema["items"], owner, path, f"{where}[{i}]")

    def walk_struct(self, value: dict[str, Any], props: dict[str, Any], struct: str, path: str,
                    where: str) -> None:
        for key in list(value):
            if key not in props:
                self.unknown.append(f"{where}.{key}" if where else key)
                del value[key]
            else:
                self.walk(value[key], props[key], struct, f"{path}.{key}" if path else key,
                          f"{where}.{key}" if where else key)


def check(rt: Any, obj: dict[str, Any], opts: Any) -> None:
    """Decode a built-in object in place (CHECKED kinds only); warnings and errors as kube-apiserver."""
    definition = CHECKED.get(rt.key)
    if definition is None:
        return
    decoder = Decoder(rt.kind, rt.version)
    props = definitions()[definition]["properties"]
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
    decoder.walk_struct(body, props, rt.kind, "", "")
    for key in [k for k in obj if k not in ("apiVersion", "kind") and k not in body]:
        del obj[key]
    report_unknown(rt, decoder.unknown, opts)
    if rt.key == "/secrets":
        merge_string_data(obj)


def merge_string_data(secret: dict[str, Any]) -> None:
    """`stringData` is write-only: the server folds it into `data` (base64) and never stores it."""
    extra = secret.pop("stringData", None) or {}
    if extra:
        data = secret.setdefault("data", {}) or {}
        data.update({k: base64.b64encode(str(v).encode()).decode() for k, v in extra.items()})
        secret["data"] = data


def report_unknown(rt: Any, paths: list[str], opts: Any) -> None:
    """fieldValidation: Strict refuses, Warn (the default) warns, Ignore drops silently."""
    if not paths or opts.validation == "Ignore":
        return
    if opts.validation == "Strict":
        raise bad_request(f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: strict decoding '
                          "error: " + ", ".join(f'unknown field "{p}"' for p in paths))
    opts.warnings.extend(f'unknown field "{p}"' for p in paths)
