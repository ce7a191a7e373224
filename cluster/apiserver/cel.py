"""CEL for CRD `x-kubernetes-validations`, compiled and run by the `cel` package (common-expression-language,
a maintained CEL implementation), plus the Kubernetes CEL library functions the emulator knows.

`compile_rule` refuses what a real server refuses when a CRD is written: syntax errors, references to
anything but `self`/`oldSelf` (and macro variables), and functions outside the environment. `evaluate` runs a
compiled rule on a schema-typed value (`type: number` fields are doubles, as in Kubernetes).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

import cel
import cel.stdlib

#: the standard CEL functions and macros (cel-spec) that every Kubernetes CEL environment has.
STANDARD = {"size", "int", "uint", "double", "string", "bytes", "bool", "type", "dyn", "has", "matches",
            "startsWith", "endsWith", "contains", "timestamp", "duration", "all", "exists", "exists_one", "map",
            "filter", "getFullYear", "getMonth", "getDayOfMonth", "getDayOfYear", "getDate", "getDayOfWeek",
            "getHours", "getMinutes", "getSeconds", "getMilliseconds"}
MACRO_VAR_RE = re.compile(r"\.(?:all|exists|exists_one|map|filter)\(\s*([A-Za-z_]\w*)\s*,")
VARIABLES = {"self", "oldSelf"}
TYPE_NAMES = {"int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type", "type"}


class CelCompileError(Exception):
    """The rule does not compile in the Kubernetes CEL environment (the CRD is refused)."""


class CelError(Exception):
    """A runtime evaluation error; `overload` marks Kubernetes' 'no such overload' family."""

    def __init__(self, message: str, overload: bool = False):
        super().__init__(message)
        self.overload = overload


def _index_of(target: Any, item: Any, start: int = 0) -> int:
    if isinstance(target, str):
        return target.find(item, start)
    return next((i for i, v in enumerate(target) if v == item and type(v) is type(item)), -1)


def _last_index_of(target: Any, item: Any) -> int:
    if isinstance(target, str):
        return target.rfind(item)
    return next((i for i in range(len(target) - 1, -1, -1) if target[i] == item), -1)


def _find(text: str, pattern: str) -> str:
    match = re.search(pattern, text)
    return match.group(0) if match else ""


def _find_all(text: str, pattern: str, limit: int = -1) -> list[str]:
    found = [m.group(0) for m in re.finditer(pattern, text)]
    return found if limit < 0 else found[:limit]


def kubernetes_functions() -> dict[str, Callable[..., Any]]:
    """The Kubernetes CEL library functions: strings and sets extensions, lists (isSorted, sum, min, max,
    indexOf, lastIndexOf) and regex (find, findAll)."""
    scratch = cel.Context()
    cel.stdlib.add_stdlib_to_context(scratch, ["core", "strings", "sets"])
    functions = dict(scratch.functions)
    functions.update({"isSorted": lambda xs: list(xs) == sorted(xs), "indexOf": _index_of,
                      "lastIndexOf": _last_index_of, "find": _find, "findAll": _find_all})
    return functions


FUNCTIONS = kubernetes_functions()


@dataclass(frozen=True)
class Rule:
    """A compiled rule."""
    source: str
    program: Any
    uses_old_self: bool


def _column(source: str, name: str) -> int:
    match = re.search(rf"\b{re.escape(name)}\b", source)
    return (match.start() if match else 0) + 1


@lru_cache(maxsize=1024)
def compile_rule(source: str) -> Rule:
    """Compile a rule, or raise CelCompileError with cel-go's wording ('undeclared reference to ...')."""
    try:
        program = cel.compile(source)
    except ValueError as exc:
        text = str(exc)
        raise CelCompileError(f"compilation failed: {text[text.find('ERROR:'):] if 'ERROR:' in text else text}") \
            from None
    refs = program.references()
    bound = set(MACRO_VAR_RE.findall(source))
    unknown = [n for n in refs["variables"] if n not in VARIABLES | bound | TYPE_NAMES]
    unknown += [n for n in refs["functions"] if n[0] not in "_@!" and n not in STANDARD and n not in FUNCTIONS]
    if unknown:
        name = min(unknown, key=lambda n: _column(source, n))
        raise CelCompileError(f"compilation failed: ERROR: <input>:1:{_column(source, name)}: undeclared "
                              f"reference to '{name}' (in container '')")
    return Rule(source, program, "oldSelf" in refs["variables"])


def typed(value: Any, schema: dict[str, Any] | None) -> Any:
    """The value as Kubernetes hands it to CEL: `number` fields are doubles even when written as 1."""
    if not schema:
        return value
    if isinstance(value, dict):
        props, extra = schema.get("properties") or {}, schema.get("additionalProperties")
        return {k: typed(v, props.get(k) or (extra if isinstance(extra, dict) else None)) for k, v in value.items()}
    if isinstance(value, list):
        return [typed(v, schema.get("items")) for v in value]
    if schema.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def evaluate(rule: Rule, self_value: Any, old_value: Any = None) -> Any:
    """Run a compiled rule; runtime errors become CelError with the messages Kubernetes wraps."""
    env: dict[str, Any] = {"self": self_value, **FUNCTIONS}
    if rule.uses_old_self:
        env["oldSelf"] = old_value
    try:
        return rule.program.execute(env)
    except KeyError as exc:
        raise CelError(f"no such key: {exc.args[0] if exc.args else ''}") from None
    except IndexError as exc:
        raise CelError(str(exc) or "index out of bounds") from None
    except ZeroDivisionError:
        raise CelError("division by zero") from None
    except OverflowError:
        raise CelError("integer overflow") from None
    except TypeError as exc:
        raise CelError("no such overload", overload=True) from exc
    except (RuntimeError, ValueError) as exc:
        raise CelError(str(exc).split(". ")[0]) from None
