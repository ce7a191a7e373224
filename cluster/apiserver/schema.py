"""Structural OpenAPI v3 schemas of CRDs: pruning, defaulting and validation with real-server field paths.

The order matches kube-apiserver: prune unknown fields, apply defaults, then validate (types, required,
enum, bounds, lengths, patterns, items, then CEL `x-kubernetes-validations`).
"""
from __future__ import annotations

import copy
import json
import logging
import re
from functools import lru_cache
from typing import Any

from specfleet.cluster.apiserver import cel
from specfleet.cluster.apiserver.errors import Cause

log = logging.getLogger(__name__)
PRESERVE = "x-kubernetes-preserve-unknown-fields"
ROOT_KEEP = ("apiVersion", "kind", "metadata")
MISSING = object()


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# ---------------------------------------------------------------- pruning
def prune(value: Any, schema: dict[str, Any], path: str = "", root: bool = False) -> list[str]:
    """Drop fields the schema does not declare (in place); returns the dropped paths."""
    dropped: list[str] = []
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        keep_unknown = schema.get(PRESERVE) or (props is None and extra is None and schema.get("type") != "object")
        embedded = root or schema.get("x-kubernetes-embedded-resource")
        for key in list(value):
            child = (props or {}).get(key)
            if child is None and isinstance(extra, dict):
                child = extra
            if child is not None:
                dropped += prune(value[key], child, join(path, key))
            elif not (keep_unknown or extra is True or (embedded and key in ROOT_KEEP)):
                del value[key]
                dropped.append(join(path, key))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            dropped += prune(item, schema["items"], f"{path}[{i}]")
    return dropped


# ---------------------------------------------------------------- defaulting
def apply_defaults(value: Any, schema: dict[str, Any]) -> None:
    """Fill in `default`s for missing properties (in place), and drop nulls that are not nullable."""
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key, child in props.items():
            if value.get(key, MISSING) is None and not child.get("nullable"):
                del value[key]
            if key not in value and "default" in child:
                value[key] = copy.deepcopy(child["default"])
            if key in value:
                apply_defaults(value[key], child)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in set(value) - set(props):
                apply_defaults(value[key], extra)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            apply_defaults(item, schema["items"])


# ---------------------------------------------------------------- validation
def show(value: Any) -> str:
    """How Go's validation messages print an invalid value."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return '"object"' if isinstance(value, dict) else '"array"'
    return "null" if value is None else str(value)


def type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {str: "string", dict: "object", list: "array"}.get(type(value), "null")


def type_ok(value: Any, schema: dict[str, Any]) -> bool:
    if value is None:
        return bool(schema.get("nullable"))
    if schema.get("x-kubernetes-int-or-string"):
        return type_name(value) in ("integer", "string")
    want = schema.get("type")
    if not want:
        return True
    got = type_name(value)
    return got == want or (want == "number" and got == "integer") or (
        want == "integer" and isinstance(value, float) and value.is_integer())


def validate(value: Any, schema: dict[str, Any], path: str = "", old: Any = MISSING) -> list[Cause]:
    if not type_ok(value, schema):
        kind = type_name(value)
        return [Cause("FieldValueInvalid",
                      f'Invalid value: "{kind}": {path} in body must be of type {schema.get("type")}: "{kind}"',
                      path)]
    causes = scalar_causes(value, schema, path)
    if isinstance(value, dict):
        causes += object_causes(value, schema, path, old)
    elif isinstance(value, list):
        causes += array_causes(value, schema, path)
    causes += combinator_causes(value, schema, path)
    causes += rule_causes(value, schema, path, old)
    return causes


def scalar_causes(value: Any, schema: dict[str, Any], path: str) -> list[Cause]:
    out = []
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(show(v) for v in schema["enum"])
        out.append(Cause("FieldValueNotSupported", f"Unsupported value: {show(value)}: supported values: {allowed}",
                         path))
    if type_name(value) in ("integer", "number"):
        out += number_causes(value, schema, path)
    if isinstance(value, str):
        out += string_causes(value, schema, path)
    return out


def number_causes(value: float, schema: dict[str, Any], path: str) -> list[Cause]:
    out, bad = [], lambda text: Cause("FieldValueInvalid", f"Invalid value: {show(value)}: {path} in body {text}",
                                      path)
    if "minimum" in schema:
        lo, excl = schema["minimum"], schema.get("exclusiveMinimum")
        if value < lo or (excl and value == lo):
            out.append(bad(f"should be greater than {'' if excl else 'or equal to '}{lo}"))
    if "maximum" in schema:
        hi, excl = schema["maximum"], schema.get("exclusiveMaximum")
        if value > hi or (excl and value == hi):
            out.append(bad(f"should be less than {'' if excl else 'or equal to '}{hi}"))
    if schema.get("multipleOf") and (value / schema["multipleOf"]) % 1:
        out.append(bad(f"should be a multiple of {schema['multipleOf']}"))
    return out


@lru_cache(maxsize=256)
def _pattern(text: str) -> re.Pattern[str]:
    return re.compile(text)


def string_causes(value: str, schema: dict[str, Any], path: str) -> list[Cause]:
    out = []
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        out.append(Cause("FieldValueTooLong", f"Too long: may not be more than {schema['maxLength']} bytes", path))
    if "minLength" in schema and len(value) < schema["minLength"]:
        out.append(Cause("FieldValueInvalid", f"Invalid value: {show(value)}: {path} in body should be at least "
                         f"{schema['minLength']} chars long", path))
    if "pattern" in schema and not _pattern(schema["pattern"]).search(value):
        out.append(Cause("FieldValueInvalid", f"Invalid value: {show(value)}: {path} in body should match "
                         f"'{schema['pattern']}'", path))
    return out


def object_causes(value: dict, schema: dict[str, Any], path: str, old: Any) -> list[Cause]:
    out = [Cause("FieldValueRequired", "Required value", join(path, key))
           for key in schema.get("required") or [] if key not in value]
    props = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    old_map = old if isinstance(old, dict) else {}
    for key, child_value in value.items():
        child = props.get(key) or (extra if isinstance(extra, dict) else None)
        if child is not None:
            out += validate(child_value, child, join(path, key), old_map.get(key, MISSING))
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        out.append(Cause("FieldValueTooMany", f"Too many: {len(value)}: must have at most "
                         f"{schema['maxProperties']} items", path))
    if "minProperties" in schema and len(value) < schema["minProperties"]:
        out.append(Cause("FieldValueInvalid", f"Invalid value: {len(value)}: {path} in body should have at "
                         f"least {schema['minProperties']} properties", path))
    return out


def array_causes(value: list, schema: dict[str, Any], path: str) -> list[Cause]:
    out = []
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        out.append(Cause("FieldValueTooMany", f"Too many: {len(value)}: must have at most {schema['maxItems']} "
                         "items", path))
    if "minItems" in schema and len(value) < schema["minItems"]:
        out.append(Cause("FieldValueInvalid", f"Invalid value: {len(value)}: {path} in body should have at least "
                         f"{schema['minItems']} items", path))
    if schema.get("uniqueItems") or schema.get("x-kubernetes-list-type") == "set":
        seen = []
        for i, item in enumerate(value):
            if item in seen:
                out.append(Cause("FieldValueDuplicate", f"Duplicate value: {show(item)}", f"{path}[{i}]"))
            seen.append(item)
    if isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            out += validate(item, schema["items"], f"{path}[{i}]")
    return out


def combinator_causes(value: Any, schema: dict[str, Any], path: str) -> list[Cause]:
    out = []
    for sub in schema.get("allOf") or []:
        out += validate(value, sub, path)
    for key in ("anyOf", "oneOf"):
        subs = schema.get(key)
        if subs:
            passing = sum(1 for sub in subs if not validate(value, sub, path))
            if passing == 0 or (key == "oneOf" and passing > 1):
                out.append(Cause("FieldValueInvalid", f"Invalid value: {show(value)}: {path} in body must "
                                 f"validate {'one and only one' if key == 'oneOf' else 'at least one'} schema "
                                 f"({key})", path))
    if "not" in schema and not validate(value, schema["not"], path):
        out.append(Cause("FieldValueInvalid", f"Invalid value: {show(value)}: {path} in body must not validate "
                         "the schema (not)", path))
    return out


# ---------------------------------------------------------------- CEL rules
@lru_cache(maxsize=512)
def compiled(rule: str) -> tuple | None:
    try:
        return cel.compile_rule(rule)
    except cel.CelUnsupported as exc:
        log.warning("skipping x-kubernetes-validations rule %r: %s", rule, exc)
        return None


def rule_causes(value: Any, schema: dict[str, Any], path: str, old: Any) -> list[Cause]:
    out = []
    for spec in schema.get("x-kubernetes-validations") or []:
        rule = spec.get("rule", "")
        if cel.uses_old_self(rule) and old is MISSING:
            continue                                 # transition rules only run on updates
        program = compiled(rule)
        if program is None:
            continue
        try:
            ok = cel.evaluate(program, {"self": value, "oldSelf": None if old is MISSING else old}) is True
            message = spec.get("message") or f"failed rule: {rule}"
        except cel.CelError as exc:
            ok, message = False, f"{exc}: evaluating rule: {rule}"
        if not ok:
            where = join(path, spec["fieldPath"].lstrip(".")) if spec.get("fieldPath") else path
            out.append(Cause(spec.get("reason", "FieldValueInvalid"),
                             f"Invalid value: {show(value)}: {message}", where))
    return out
