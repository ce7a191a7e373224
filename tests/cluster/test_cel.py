"""CEL rules run by the `cel` package with the Kubernetes library functions, and refused when they do not compile."""
import pytest

from specfleet.cluster.apiserver.cel import CelCompileError, CelError, compile_rule, evaluate, typed


def run(rule, value, old=None):
    return evaluate(compile_rule(rule), value, old)


@pytest.mark.parametrize("rule,value,expected", [
    ("self.minReplicas <= self.maxReplicas", {"minReplicas": 1, "maxReplicas": 2}, True),
    ("self.method != 'draft' || has(self.draftModel)", {"method": "draft"}, False),
    ("self.method != 'draft' || has(self.draftModel)", {"method": "draft", "draftModel": {}}, True),
    ("!has(self.x) || self.x > 0", {}, True),
    ("self.items.all(i, i.size() <= 3) && size(self.items) == 2", {"items": ["a", "bcd"]}, True),
    ("self.items.exists(i, i == 'b')", {"items": ["a"]}, False),
    ("self.s.startsWith('hf://') ? self.s.size() > 5 : true", {"s": "hf://x/y"}, True),
    ("self.k in ['a', 'b'] && self.n % 2 == 0 && self.f * 2.0 >= 1.0", {"k": "a", "n": 4, "f": 0.5}, True),
    ("type(self) == string ? self == 'auto' : (self >= 1 && self <= 64)", "auto", True),
    ("type(self) == string ? self == 'auto' : (self >= 1 && self <= 64)", "two", False),
    ("type(self) == string ? self == 'auto' : (self >= 1 && self <= 64)", 100, False),
    ("type(self) == string ? self == 'auto' : (self >= 1 && self <= 64)", 8, True),
    ("self.name.lowerAscii() == 'abc' && self.name.upperAscii() == 'ABC'", {"name": "aBc"}, True),
    ("self.xs.isSorted() && self.xs.indexOf(3) == 1 && self.xs.sum() == 4", {"xs": [1, 3]}, True),
    ("self.s.find('[0-9]+') == '42' && self.s.indexOf('4') == 1", {"s": "a42"}, True),
])
def test_rules_evaluate_like_kubernetes_cel(rule, value, expected):
    assert run(rule, value) is expected


def test_missing_fields_are_errors_unless_absorbed():
    with pytest.raises(CelError, match="no such key: x"):
        run("self.x > 1", {})
    assert run("self.x > 1 || true", {}) is True


def test_mixed_types_are_no_such_overload():
    with pytest.raises(CelError) as err:
        run("self.x + 1 > 0", {"x": "s"})
    assert err.value.overload


def test_number_fields_are_doubles_in_cel():
    schema = {"type": "object", "properties": {"f": {"type": "number"}}}
    assert run("self.f * 2.0 == 2.0", typed({"f": 1}, schema)) is True


def test_transition_rule_sees_old_self():
    assert run("self >= oldSelf", 3, 2) is True
    assert compile_rule("self >= oldSelf").uses_old_self


@pytest.mark.parametrize("rule,why", [
    ("self +", "Syntax error"),
    ("other.x == 1", "undeclared reference to 'other'"),
    ("quantity(self.q).isGreaterThan(quantity('1'))", "undeclared reference to 'quantity'"),
])
def test_rules_outside_the_environment_do_not_compile(rule, why):
    with pytest.raises(CelCompileError, match="compilation failed") as err:
        compile_rule(rule)
    assert why in str(err.value)
