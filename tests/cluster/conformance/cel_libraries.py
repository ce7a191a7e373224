"""Compare the CEL implementations on PyPI on the rules this suite checks (not collected by pytest).

    .venv/bin/pip install cel-python common-expression-language
    .venv/bin/python tests/cluster/conformance/cel_libraries.py

Each library gets the same (rule, self, expected) cases; 'error' means the rule must fail to evaluate or
compile. Prints one row per library: cases right, and mean microseconds per evaluation.
"""
from __future__ import annotations

import time
from typing import Any, Callable

CASES: list[tuple[str, Any, Any]] = [
    ("type(self) == string ? self == 'auto' : (self >= 1 && self <= 64)", "auto", True),
    ("type(self) == string ? self == 'auto' : (self >= 1 && self <= 64)", "two", False),
    ("type(self) == string ? self == 'auto' : (self >= 1 && self <= 64)", 100, False),
    ("type(self) == string ? self == 'auto' : (self >= 1 && self <= 64)", 8, True),
    ("!self.startsWith('builtin:') || self == 'builtin:smollm2-135m'", "builtin:other", False),
    ("self.numAttentionHeads % self.numKvHeads == 0", {"numAttentionHeads": 32, "numKvHeads": 8}, True),
    ("!has(self.promptTokens) || self.promptTokens < self.maxContextTokens", {"maxContextTokens": 16}, True),
    ("self.method != 'draft' || has(self.draftModel)", {"method": "draft"}, False),
    ("self.minReplicas <= self.maxReplicas", {"minReplicas": 5, "maxReplicas": 2}, False),
    ("self.x > 1 || true", {}, True),
    ("self.x > 1", {}, "error"),
    ("self.a + 1 > 0", {"a": "s"}, "error"),
    ("self.items.all(i, i.size() <= 3) && size(self.items) == 2", {"items": ["a", "bcd"]}, True),
    ("self.items.exists_one(i, i == 'b')", {"items": ["a", "b"]}, True),
    ("self.items.map(i, i + '!').filter(i, i.endsWith('!')).size() == 2", {"items": ["a", "b"]}, True),
    ("self.f * 2.0 == 3.0", {"f": 1.5}, True),
    ("self.s.matches('^[a-z]+$')", {"s": "abc"}, True),
    ("self.s.lowerAscii() == 'abc'", {"s": "ABC"}, True),
    ("self +", 1, "error"),
    ("1 / 0 == 0", 1, "error"),
]


def run_common_expression_language() -> Callable[[str, Any], Any]:
    from specfleet.cluster.apiserver import cel as kcel             # the emulator's wrapper of `cel`

    def run(rule: str, value: Any) -> Any:
        return kcel.evaluate(kcel.compile_rule(rule), value)
    return run


def run_cel_python() -> Callable[[str, Any], Any]:
    import celpy

    env = celpy.Environment()

    def run(rule: str, value: Any) -> Any:
        program = env.program(env.compile(rule))
        out = program.evaluate({"self": celpy.json_to_cel(value)})
        if isinstance(out, Exception):
            raise out
        return bool(out) if type(out).__name__ == "BoolType" else out
    return run


def score(run: Callable[[str, Any], Any]) -> tuple[int, float]:
    right, started = 0, time.perf_counter()
    for rule, value, expected in CASES:
        try:
            got = run(rule, value)
        except Exception:                                           # any failure counts as 'error'
            got = "error"
        right += got == expected
    return right, (time.perf_counter() - started) / len(CASES) * 1e6


def main() -> None:
    print(f"{'library':32} {'right':>7} {'us/eval':>9}")
    for name, factory in (("common-expression-language (cel)", run_common_expression_language),
                          ("cel-python (celpy)", run_cel_python)):
        try:
            right, micros = score(factory())
        except ImportError as exc:
            print(f"{name:32} not installed ({exc.name})")
            continue
        print(f"{name:32} {right:>4}/{len(CASES):<2} {micros:>9.0f}")


if __name__ == "__main__":
    main()
