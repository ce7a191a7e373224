"""CEL cost limits for CRD validation rules, with Kubernetes' limits and messages.

Kubernetes charges a comprehension (`all`, `exists`, `exists_one`, `map`, `filter`) its body once per element,
so nested comprehensions multiply the sizes of the collections they walk. The estimate here follows that
shape: a rule costs its size in tokens, plus, for every comprehension, its body's tokens times the product
of the element counts of it and every comprehension around it. When a CRD is written the counts come from
the schema (`maxItems`/`maxProperties`, else as many of the smallest element as a 3 MiB request can hold,
as Kubernetes assumes); when an object is validated they come from the object itself.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

STATIC_LIMIT = 10_000_000          # StaticEstimatedCostLimit: one rule, when the CRD is written
STATIC_CRD_LIMIT = 100_000_000     # StaticEstimatedCRDCostLimit: all rules of a CRD
PER_CALL_LIMIT = 1_000_000         # PerCallLimit: one rule on one object
RUNTIME_BUDGET = 10_000_000        # RuntimeCELCostBudget: all rules on one object
MAX_REQUEST_BYTES = 3 * 1024 * 1024
COMPREHENSION_RE = re.compile(r"([A-Za-z_][\w.]*)\.(?:all|exists_one|exists|map|filter)(\()\s*([A-Za-z_]\w*)\s*,")
TOKEN_RE = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|\w+|\S")


@dataclass(frozen=True)
class Comprehension:
    receiver: tuple[str, ...]       # the walked collection as a path: ("self", "items") or ("i", "ports")
    var: str
    start: int                      # the call's parentheses, as offsets in the rule
    end: int
    body_tokens: int


def closing_paren(source: str, open_at: int) -> int:
    depth, quote = 0, ""
    for i in range(open_at, len(source)):
        ch = source[i]
        if quote:
            quote = "" if ch == quote and source[i - 1] != "\\" else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i
    return len(source)


def comprehensions(source: str) -> list[Comprehension]:
    out = []
    for match in COMPREHENSION_RE.finditer(source):
        open_at = match.start(2)
        end = closing_paren(source, open_at)
        out.append(Comprehension(tuple(match.group(1).split(".")), match.group(3), open_at, end,
                                 len(TOKEN_RE.findall(source[open_at:end]))))
    return out


def enclosing(item: Comprehension, all_items: list[Comprehension]) -> list[Comprehension]:
    return [c for c in all_items if c is not item and c.start < item.start and item.end <= c.end]


def rule_cost(source: str, cardinality: Callable[[Comprehension, list[Comprehension]], int]) -> int:
    items = comprehensions(source)
    total = len(TOKEN_RE.findall(source))
    for item in items:
        factor = cardinality(item, items)
        for outer in enclosing(item, items):
            factor *= cardinality(outer, items)
        total += item.body_tokens * factor
    return total


# ---------------------------------------------------------------- static: sizes from the schema
def min_size(schema: dict[str, Any] | None) -> int:
    """The fewest JSON bytes one element can take, with its separator (Kubernetes' unbounded estimate)."""
    kind = (schema or {}).get("type")
    return {"string": 3, "integer": 2, "number": 2, "boolean": 5, "array": 3, "object": 3}.get(kind, 2)


def element_schema(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    if not schema:
        return None
    if schema.get("type") == "array":
        return schema.get("items")
    return {"type": "string"}                           # iterating a map walks its keys


def child(schema: dict[str, Any] | None, key: str) -> dict[str, Any] | None:
    if not schema:
        return None
    extra = schema.get("additionalProperties")
    return (schema.get("properties") or {}).get(key) or (extra if isinstance(extra, dict) else None)


def schema_at(path: tuple[str, ...], root: dict[str, Any], items: list[Comprehension]) -> dict[str, Any] | None:
    head, rest = path[0], path[1:]
    if head in ("self", "oldSelf"):
        node = root
    else:
        owner = next((c for c in items if c.var == head), None)
        node = element_schema(schema_at(owner.receiver, root, items)) if owner else None
    for key in rest:
        node = child(node, key)
    return node


def static_cardinality(schema: dict[str, Any]) -> Callable[[Comprehension, list[Comprehension]], int]:
    def count(item: Comprehension, items: list[Comprehension]) -> int:
        node = schema_at(item.receiver, schema, items)
        bound = (node or {}).get("maxItems" if (node or {}).get("type") == "array" else "maxProperties")
        if bound is not None:
            return int(bound)
        return MAX_REQUEST_BYTES // min_size(element_schema(node))
    return count


def estimated_cost(source: str, schema: dict[str, Any]) -> int:
    return rule_cost(source, static_cardinality(schema))


# ---------------------------------------------------------------- runtime: sizes from the object
def values_at(path: tuple[str, ...], value: Any, items: list[Comprehension]) -> list[Any]:
    head, rest = path[0], path[1:]
    if head in ("self", "oldSelf"):
        found = [value]
    else:
        owner = next((c for c in items if c.var == head), None)
        found = [e for v in (values_at(owner.receiver, value, items) if owner else [])
                 if isinstance(v, (list, dict)) for e in v]
    for key in rest:
        found = [v[key] for v in found if isinstance(v, dict) and key in v]
    return found


def actual_cost(source: str, value: Any) -> int:
    def count(item: Comprehension, items: list[Comprehension]) -> int:
        return max((len(v) for v in values_at(item.receiver, value, items) if isinstance(v, (list, dict))),
                   default=0)
    return rule_cost(source, count)


def budget_message(name: str, cost: int, limit: int) -> str:
    """getCostErrorMessage's wording."""
    factor = cost / limit
    shown = "more than 100x" if factor > 100 else (f"{factor:f}x" if factor < 1.5 else f"{factor:.1f}x")
    return (f"{name} exceeds budget by factor of {shown} (try simplifying the rule, or adding maxItems, "
            "maxProperties, and maxLength where arrays, maps, and strings are declared)")
