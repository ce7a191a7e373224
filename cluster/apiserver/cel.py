"""A small, safe evaluator for the CEL subset used in CRD `x-kubernetes-validations` rules.

Supported: literals (int, double, string, bool, null, lists, maps), `self` / `oldSelf`, field access,
indexing, `! - * / % + - < <= > >= == != in && || ?:`, `has(x.f)`, `size()`, `int() double() string()`,
string `startsWith endsWith contains matches lowerAscii upperAscii`, and the macros `all exists exists_one
map filter`. `&&` and `||` absorb errors the way CEL does (`true || error` is true). Anything else
raises `CelUnsupported` when the rule is compiled, so the caller can skip it with a warning.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

TOKEN_RE = re.compile(r"""\s*(?:
    (?P<num>\d+\.\d+(?:[eE][-+]?\d+)?|\d+[uU]?)
  | (?P<str>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
  | (?P<op>&&|\|\||==|!=|<=|>=|[-+*/%!<>?:.,()\[\]{}])
  | (?P<id>[A-Za-z_][A-Za-z0-9_]*)
)""", re.VERBOSE)
MACROS = {"all", "exists", "exists_one", "map", "filter"}
METHODS = {"size", "startsWith", "endsWith", "contains", "matches", "lowerAscii", "upperAscii"}
FUNCTIONS = {"size", "int", "double", "string", "uint", "bool"}


class CelUnsupported(Exception):
    """The rule uses CEL outside the supported subset."""


class CelError(Exception):
    """A runtime evaluation error (missing key, bad types...)."""


def tokenize(text: str) -> list[tuple[str, Any]]:
    tokens, pos = [], 0
    text = text.strip()
    while pos < len(text):
        m = TOKEN_RE.match(text, pos)
        if not m or m.end() == pos:
            raise CelUnsupported(f"cannot tokenize at {text[pos:pos + 10]!r}")
        pos = m.end()
        kind = m.lastgroup
        value = m.group(kind)
        if kind == "num":
            value = float(value) if "." in value else int(value.rstrip("uU"))
        elif kind == "str":
            value = bytes(value[1:-1], "utf-8").decode("unicode_escape")
        tokens.append((kind, value))
    return tokens


@dataclass
class Parser:
    tokens: list[tuple[str, Any]]
    pos: int = 0

    def peek(self) -> tuple[str, Any] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def accept(self, op: str) -> bool:
        tok = self.peek()
        if tok and tok[0] in ("op", "id") and tok[1] == op:
            self.pos += 1
            return True
        return False

    def expect(self, op: str) -> None:
        if not self.accept(op):
            raise CelUnsupported(f"expected {op!r}")

    def parse(self) -> tuple:
        node = self.conditional()
        if self.peek() is not None:
            raise CelUnsupported(f"unexpected {self.peek()[1]!r}")
        return node

    def conditional(self) -> tuple:
        cond = self.binary(0)
        if self.accept("?"):
            yes = self.conditional()
            self.expect(":")
            return ("?", cond, yes, self.conditional())
        return cond

    LEVELS = [("||",), ("&&",), ("==", "!=", "<", "<=", ">", ">=", "in"), ("+", "-"), ("*", "/", "%")]

    def binary(self, level: int) -> tuple:
        if level == len(self.LEVELS):
            return self.unary()
        node = self.binary(level + 1)
        while True:
            tok = self.peek()
            if not tok or tok[1] not in self.LEVELS[level] or tok[0] == "str":
                return node
            self.pos += 1
            node = (tok[1], node, self.binary(level + 1))

    def unary(self) -> tuple:
        if self.accept("!"):
            return ("not", self.unary())
        if self.accept("-"):
            return ("neg", self.unary())
        return self.postfix(self.primary())

    def args(self) -> list[tuple]:
        out = []
        if not self.accept(")"):
            out.append(self.conditional())
            while self.accept(","):
                out.append(self.conditional())
            self.expect(")")
        return out

    def postfix(self, node: tuple) -> tuple:
        while True:
            if self.accept("."):
                kind, name = self.tokens[self.pos]
                self.pos += 1
                if self.accept("("):
                    node = self.method(node, name, self.args())
                else:
                    node = ("field", node, name)
            elif self.accept("["):
                index = self.conditional()
                self.expect("]")
                node = ("index", node, index)
            else:
                return node

    def method(self, target: tuple, name: str, args: list[tuple]) -> tuple:
        if name in MACROS:
            if len(args) != 2 or args[0][0] != "ident":
                raise CelUnsupported(f"bad macro {name}")
            return ("macro", name, target, args[0][1], args[1])
        if name not in METHODS:
            raise CelUnsupported(f"unsupported method {name}")
        return ("call", name, [target, *args])

    def primary(self) -> tuple:
        tok = self.peek()
        if tok is None:
            raise CelUnsupported("unexpected end")
        self.pos += 1
        kind, value = tok
        if kind in ("num", "str"):
            return ("lit", value)
        if kind == "id":
            return self.identifier(value)
        if value == "(":
            node = self.conditional()
            self.expect(")")
            return node
        if value == "[":
            items = [] if self.accept("]") else self.list_items()
            return ("list", items)
        raise CelUnsupported(f"unexpected {value!r}")

    def list_items(self) -> list[tuple]:
        items = [self.conditional()]
        while self.accept(","):
            items.append(self.conditional())
        self.expect("]")
        return items

    def identifier(self, name: str) -> tuple:
        literals = {"true": True, "false": False, "null": None}
        if name in literals:
            return ("lit", literals[name])
        if self.accept("("):
            args = self.args()
            if name == "has":
                if len(args) != 1 or args[0][0] != "field":
                    raise CelUnsupported("has() needs a field selection")
                return ("has", args[0][1], args[0][2])
            if name not in FUNCTIONS:
                raise CelUnsupported(f"unsupported function {name}")
            return ("call", name, args)
        return ("ident", name)


def compile_rule(rule: str) -> tuple:
    return Parser(tokenize(rule)).parse()


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def evaluate(node: tuple, env: dict[str, Any]) -> Any:
    op = node[0]
    if op == "lit":
        return node[1]
    if op == "ident":
        if node[1] not in env:
            raise CelError(f"undeclared reference to '{node[1]}'")
        return env[node[1]]
    if op == "list":
        return [evaluate(n, env) for n in node[1]]
    if op == "field":
        target = evaluate(node[1], env)
        if not isinstance(target, dict) or node[2] not in target:
            raise CelError(f"no such key: {node[2]}")
        return target[node[2]]
    if op == "has":
        target = evaluate(node[1], env)
        return isinstance(target, dict) and node[2] in target
    if op == "index":
        return _index(evaluate(node[1], env), evaluate(node[2], env))
    if op in ("&&", "||"):
        return _logic(op, node[1], node[2], env)
    if op == "?":
        return evaluate(node[2] if _bool(evaluate(node[1], env)) else node[3], env)
    if op == "not":
        return not _bool(evaluate(node[1], env))
    if op == "neg":
        value = evaluate(node[1], env)
        if not _num(value):
            raise CelError("no such overload for -")
        return -value
    if op == "call":
        return _call(node[1], [evaluate(a, env) for a in node[2]])
    if op == "macro":
        return _macro(node, env)
    return _binary(op, evaluate(node[1], env), evaluate(node[2], env))


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise CelError("no matching overload: expected bool")
    return value


def _logic(op: str, left: tuple, right: tuple, env: dict[str, Any]) -> bool:
    decisive = op == "||"
    results, error = [], None
    for side in (left, right):
        try:
            value = _bool(evaluate(side, env))
        except CelError as exc:
            error = exc
            continue
        if value == decisive:
            return decisive
        results.append(value)
    if error:
        raise error
    return not decisive


def _index(target: Any, key: Any) -> Any:
    if isinstance(target, dict):
        if key not in target:
            raise CelError(f"no such key: {key}")
        return target[key]
    if isinstance(target, (list, str)) and isinstance(key, int) and 0 <= key < len(target):
        return target[key]
    raise CelError("index out of range")


def _binary(op: str, a: Any, b: Any) -> Any:
    if op == "==":
        return a == b and type(a) is not bool or (a == b and type(a) is type(b))
    if op == "!=":
        return not _binary("==", a, b)
    if op == "in":
        if not isinstance(b, (list, dict)):
            raise CelError("no matching overload for 'in'")
        return a in b
    same = (_num(a) and _num(b)) or (type(a) is type(b) and not isinstance(a, (dict, bool, type(None))))
    if not same:
        raise CelError(f"no matching overload for '{op}'")
    if op in ("<", "<=", ">", ">="):
        return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
    if op in ("+", "-", "*") and (op == "+" or _num(a)):
        return {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b}[op]()
    if op in ("/", "%") and _num(a):
        if b == 0:
            raise CelError("division by zero")
        if op == "%":
            return a % b
        return a // b if isinstance(a, int) and isinstance(b, int) else a / b
    raise CelError(f"no matching overload for '{op}'")


def _call(name: str, args: list[Any]) -> Any:
    try:
        if name == "size":
            return len(args[0])
        if name in ("int", "uint"):
            return int(args[0])
        if name == "double":
            return float(args[0])
        if name == "string":
            return str(args[0]).lower() if isinstance(args[0], bool) else str(args[0])
        if name == "bool":
            return args[0] in (True, "true")
        s = args[0]
        if not isinstance(s, str):
            raise CelError(f"{name} needs a string")
        return {"startsWith": lambda: s.startswith(args[1]), "endsWith": lambda: s.endswith(args[1]),
                "contains": lambda: args[1] in s, "matches": lambda: re.search(args[1], s) is not None,
                "lowerAscii": lambda: s.lower(), "upperAscii": lambda: s.upper()}[name]()
    except (TypeError, ValueError, re.error) as exc:
        raise CelError(str(exc)) from exc


def _macro(node: tuple, env: dict[str, Any]) -> Any:
    _, name, target_node, var, body = node
    target = evaluate(target_node, env)
    items = list(target.keys()) if isinstance(target, dict) else target
    if not isinstance(items, list):
        raise CelError(f"{name} needs a list or map")
    values = [evaluate(body, {**env, var: item}) for item in items]
    if name == "map":
        return values
    if name == "filter":
        return [item for item, keep in zip(items, values) if _bool(keep)]
    flags = [_bool(v) for v in values]
    return {"all": all(flags), "exists": any(flags), "exists_one": sum(flags) == 1}[name]


def uses_old_self(rule: str) -> bool:
    return re.search(r"\boldSelf\b", rule) is not None
