"""Structural OpenAPI v3 schemas of CRDs: pruning, defaulting and validation with real-server field paths.

The order matches kube-apiserver: prune unknown fields, apply defaults, validate against the schema (types,
required, enum, bounds, lengths, patterns, items), then run the CEL `x-kubernetes-validations` rules, unless
a schema error already blocks them (a wrong type, a missing required field, an unsupported enum value, a
string or list too long), in which case the server says the rules were not checked.
"""
from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from specfleet.cluster.apiserver import cel, cel_cost
from specfleet.cluster.apiserver.errors import Cause

PRESERVE = "x-kubernetes-preserve-unknown-fields"
ROOT_KEEP = ("apiVersion", "kind", "metadata")
MISSING = object()
#: schema errors after which kube-apiserver does not run CEL rules (hasBlockingErr)
BLOCKING = ("FieldValueNotSupported", "FieldValueRequired", "FieldValueTooLong", "FieldValueTooMany",
            "FieldValueTypeInvalid")
RULES_SKIPPED = Cause("FieldValueInvalid", 'Invalid value: "null": some validation rules were not checked because '
                      "the object was invalid; correct the existing errors to complete validation", "<nil>")


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
    """Schema errors, then CEL rule errors (or the note that blocking schema errors kept the rules from running)."""
    causes = schema_causes(value, schema, path)
    if any(c.reason in BLOCKING for c in causes):
        return causes + ([RULES_SKIPPED] if has_rules(schema) else [])
    return causes + cel_causes(value, schema, path, old, Budget())


def has_rules(schema: Any) -> bool:
    if isinstance(schema, dict):
        return bool(schema.get("x-kubernetes-validations")) or any(has_rules(v) for v in schema.values())
    if isinstance(schema, list):
        return any(has_rules(v) for v in schema)
    return False


def schema_causes(value: Any, schema: dict[str, Any], path: str = "") -> list[Cause]:
    if not type_ok(value, schema):
        kind = type_name(value)
        return [Cause("FieldValueTypeInvalid",
                      f'Invalid value: "{kind}": {path} in body must be of type {schema.get("type")}: "{kind}"',
                      path)]
    causes = scalar_causes(value, schema, path)
    if isinstance(value, dict):
        causes += object_causes(value, schema, path)
    elif isinstance(value, list):
        causes += array_causes(value, schema, path)
    causes += combinator_causes(value, schema, path)
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


def object_causes(value: dict, schema: dict[str, Any], path: str) -> list[Cause]:
    out = [Cause("FieldValueRequired", "Required value", join(path, key))
           for key in schema.get("required") or [] if key not in value]
    for key, child_value in value.items():
        child = child_schema(schema, key)
        if child is not None:
            out += schema_causes(child_value, child, join(path, key))
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
            out += schema_causes(item, schema["items"], f"{path}[{i}]")
    return out


def combinator_causes(value: Any, schema: dict[str, Any], path: str) -> list[Cause]:
    out = []
    for sub in schema.get("allOf") or []:
        out += schema_causes(value, sub, path)
    for key in ("anyOf", "oneOf"):
        subs = schema.get(key)
        if subs:
            passing = sum(1 for sub in subs if not schema_causes(value, sub, path))
            if passing == 0 or (key == "oneOf" and passing > 1):
                out.append(Cause("FieldValueInvalid", f"Invalid value: {show(value)}: {path} in body must "
                                 f"validate {'one and only one' if key == 'oneOf' else 'at least one'} schema "
                                 f"({key})", path))
    if "not" in schema and not schema_causes(value, schema["not"], path):
        out.append(Cause("FieldValueInvalid", f"Invalid value: {show(value)}: {path} in body must not validate "
                         "the schema (not)", path))
    return out


# ---------------------------------------------------------------- CEL rules
def child_schema(schema: dict[str, Any], key: str) -> dict[str, Any] | None:
    extra = schema.get("additionalProperties")
    return (schema.get("properties") or {}).get(key) or (extra if isinstance(extra, dict) else None)


@dataclass
class Budget:
    """RuntimeCELCostBudget: what all the rules on one object may spend together."""
    left: int = cel_cost.RUNTIME_BUDGET

    @property
    def spent(self) -> bool:
        return self.left < 0


def cel_causes(value: Any, schema: dict[str, Any], path: str, old: Any, budget: Budget) -> list[Cause]:
    """Every rule in the tree, outermost first, with `oldSelf` where the old object has the same field."""
    if value is None or budget.spent:
        return []
    out = rule_causes(value, schema, path, old, budget)
    if isinstance(value, dict):
        old_map = old if isinstance(old, dict) else {}
        for key, child_value in value.items():
            child = child_schema(schema, key)
            if child is not None:
                out += cel_causes(child_value, child, join(path, key), old_map.get(key, MISSING), budget)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            out += cel_causes(item, schema["items"], f"{path}[{i}]", MISSING, budget)
    return out


def shown_type(schema: dict[str, Any]) -> str:
    """The schema type kube-apiserver prints as the 'value' of a rule error (`""` for int-or-string)."""
    return json.dumps(schema.get("type", ""))


def rule_failure(spec: dict[str, Any], value: Any, schema: dict[str, Any], path: str, detail: str) -> Cause:
    """fieldErrorForReason: the rule's `reason` picks the cause; objects and lists are not printed."""
    where = join(path, spec["fieldPath"].lstrip(".")) if spec.get("fieldPath") else path
    reason = spec.get("reason") or "FieldValueInvalid"
    if reason == "FieldValueForbidden":
        return Cause(reason, f"Forbidden: {detail}", where)
    if reason == "FieldValueRequired":
        return Cause(reason, f"Required value: {detail}", where)
    if reason == "FieldValueDuplicate":
        return Cause(reason, f"Duplicate value: {show(value)}", where)
    shown = "" if isinstance(value, (dict, list)) else f"{show(value)}: "
    return Cause("FieldValueInvalid", f"Invalid value: {shown}{detail}", where)


def rule_message(spec: dict[str, Any], value: Any, old: Any) -> str:
    """`messageExpression` when it evaluates to a one-line string, else `message`, else 'failed rule: ...'."""
    if spec.get("messageExpression"):
        try:
            text = cel.evaluate(cel.compile_rule(spec["messageExpression"]), value, old)
            if isinstance(text, str) and text.strip() and "\n" not in text:
                return text.strip()
        except (cel.CelError, cel.CelCompileError):
            pass
    return (spec.get("message") or "").strip() or f"failed rule: {spec.get('rule', '').strip()}"


def rule_error(schema: dict[str, Any], path: str, text: str) -> Cause:
    """An error about running a rule (not its verdict): the schema type stands where the value would."""
    return Cause("FieldValueInvalid", f"Invalid value: {shown_type(schema)}: {text}", path)


class OutOfBudget(Exception):
    """No further rule may run on this object; carries the error that says why."""

    def __init__(self, cause: Cause):
        super().__init__(cause.message)
        self.cause = cause


def rule_causes(value: Any, schema: dict[str, Any], path: str, old: Any, budget: Budget) -> list[Cause]:
    out = []
    for spec in schema.get("x-kubernetes-validations") or []:
        try:
            cause = run_rule(spec, value, schema, path, old, budget)
        except OutOfBudget as stop:
            budget.left = -1
            return out + [stop.cause]
        if cause is not None:
            out.append(cause)
    return out


def charge(rule: str, named: str, value: Any, schema: dict[str, Any], path: str, budget: Budget) -> None:
    """Spend the rule's cost on this object, or stop every rule (PerCallLimit, RuntimeCELCostBudget)."""
    cost = cel_cost.actual_cost(rule, value)
    if cost > cel_cost.PER_CALL_LIMIT:
        raise OutOfBudget(rule_error(schema, path, "'operation cancelled: actual cost limit exceeded': no further "
                                     f"validation rules will be run due to call cost exceeds limit for rule: {named}"))
    budget.left -= cost
    if budget.spent:
        raise OutOfBudget(rule_error(schema, path, "validation failed due to running out of cost budget, no further "
                                     "validation rules will be run"))


def run_rule(spec: dict[str, Any], value: Any, schema: dict[str, Any], path: str, old: Any,
             budget: Budget) -> Cause | None:
    """One rule on one value: None when it holds (or does not apply), else the error the server gives."""
    rule = spec.get("rule", "")
    named = (spec.get("message") or "").strip() or rule.strip()
    try:
        program = cel.compile_rule(rule)
    except cel.CelCompileError as exc:
        return rule_error(schema, path, f"rule compile error: {exc}")
    if program.uses_old_self and old is MISSING:
        return None                                  # transition rules only run on updates
    charge(rule, named, value, schema, path, budget)
    typed, typed_old = cel.typed(value, schema), None if old is MISSING else cel.typed(old, schema)
    try:
        result = cel.evaluate(program, typed, typed_old)
    except cel.CelError as exc:
        if exc.overload:
            return rule_error(schema, path, f"'{exc}': call arguments did not match a supported operator, function "
                                            f"or macro signature for rule: {named}")
        return rule_error(schema, path, f"{exc} evaluating rule: {named}")
    if result is True:
        return None
    return rule_failure(spec, value, schema, path, rule_message(spec, typed, typed_old))
