"""The CEL subset evaluator used for x-kubernetes-validations."""
import pytest

from specfleet.cluster.apiserver.cel import CelError, CelUnsupported, compile_rule, evaluate


def run(rule, value, old=None):
    return evaluate(compile_rule(rule), {"self": value, "oldSelf": old})


@pytest.mark.parametrize("rule,value,expected", [
    ("self.minReplicas <= self.maxReplicas", {"minReplicas": 1, "maxReplicas": 2}, True),
    ("self.method != 'draft' || has(self.draftModel)", {"method": "draft"}, False),
    ("self.method != 'draft' || has(self.draftModel)", {"method": "draft", "draftModel": {}}, True),
    ("!has(self.x) || self.x > 0", {}, True),
    ("self.items.all(i, i.size() <= 3) && size(self.items) == 2", {"items": ["a", "bcd"]}, True),
    ("self.items.exists(i, i == 'b')", {"items": ["a"]}, False),
    ("self.s.startsWith('hf://') ? self.s.size() > 5 : true", {"s": "hf://x/y"}, True),
    ("self.k in ['a', 'b'] && self.n % 2 == 0 && self.f * 2.0 >= 1.0", {"k": "a", "n": 4, "f": 0.5}, True),
])
def test_rules(rule, value, expected):
    assert run(rule, value) is expected


def test_missing_fields_are_errors_unless_absorbed():
    with pytest.raises(CelError):
        run("self.x > 1", {})
    assert run("self.x > 1 || true", {}) is True


def test_transition_rule_and_unsupported_syntax():
    assert run("self >= oldSelf", 3, 2) is True
    with pytest.raises(CelUnsupported):
        compile_rule("self.x.map(k, v, v)")
    with pytest.raises(CelUnsupported):
        compile_rule("duration(self.d) > duration('1s')")
