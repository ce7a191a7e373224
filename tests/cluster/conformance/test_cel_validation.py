"""CEL `x-kubernetes-validations` on the project's own CRD and on probe CRDs: every rule is evaluated by a real
CEL implementation (including `type()`), schema errors that block CEL say so, cost limits hold, and rules
that do not compile keep the CRD out."""
import pytest

from tests.cluster.conformance.helpers import CRDS, ISVCS, causes, crd_with, isvc, spec_schema

GADGETS = "/apis/example.specfleet.io/v1/namespaces/default/gadgets"
SKIPPED = ("<nil>", "FieldValueInvalid", 'Invalid value: "null": some validation rules were not checked because the '
           "object was invalid; correct the existing errors to complete validation")
COUNT_RULE = "count must be 'auto' or an integer in [1, 64]"


def gadget(**spec):
    return {"apiVersion": "example.specfleet.io/v1", "kind": "Gadget", "metadata": {"name": "g1"}, "spec": spec}


def with_rules(*rules, **properties):
    schema = spec_schema(**properties)
    schema["properties"]["spec"]["x-kubernetes-validations"] = list(rules)
    return crd_with(schema)


@pytest.mark.parametrize("count,shown", [(100, "100"), (0, "0"), ("two", '"two"')])
def test_accelerator_count_rule_uses_type_and_refuses(http, isvc_crd, count, shown):
    code, body = http.post(ISVCS, isvc(accelerator={"count": count}))
    assert code == 422
    assert body["message"] == (f'InferenceService.specfleet.io "s1" is invalid: spec.accelerator.count: Invalid '
                               f"value: {shown}: {COUNT_RULE}")


@pytest.mark.parametrize("count", ["auto", 1, 8, 64])
def test_accelerator_count_rule_admits_auto_and_1_to_64(http, isvc_crd, count):
    assert http.post(ISVCS, isvc(accelerator={"count": count}))[0] == 201


def test_string_rule_shows_the_value(http, isvc_crd):
    code, body = http.post(ISVCS, isvc(model={"name": "m", "source": "builtin:other"}))
    assert code == 422 and causes(body) == [("spec.model.source", "FieldValueInvalid", 'Invalid value: '
                                             '"builtin:other": the only builtin model is builtin:smollm2-135m')]


def test_object_rule_omits_the_value(http, isvc_crd):
    code, body = http.post(ISVCS, isvc(autoscaling={"minReplicas": 5, "maxReplicas": 2}))
    assert code == 422 and causes(body) == [("spec.autoscaling", "FieldValueInvalid",
                                             "Invalid value: minReplicas must not exceed maxReplicas")]


def test_the_ngram_bounds_rule_sees_the_defaulted_bound(http, isvc_crd):
    code, body = http.post(ISVCS, isvc(speculation={"promptLookupMin": 5}))     # promptLookupMax defaults to 4
    assert code == 422 and causes(body) == [("spec.speculation", "FieldValueInvalid",
                                             "Invalid value: promptLookupMin must not exceed promptLookupMax")]
    assert http.post(ISVCS, isvc(speculation={"promptLookupMin": 1, "promptLookupMax": 3}))[0] == 201


def test_the_fp8_rule_reads_the_defaulted_runtime(http, isvc_crd):
    fp8 = {"name": "m", "source": "builtin:smollm2-135m", "dtype": "fp8"}
    code, body = http.post(ISVCS, isvc(model=fp8))          # runtime.engine defaults to specfleet
    assert code == 422 and causes(body) == [("spec", "FieldValueInvalid", "Invalid value: model.dtype fp8 needs "
                                             "runtime.engine vllm: the specfleet engine serves bfloat16, float16 "
                                             "and float32")]
    assert http.post(ISVCS, isvc(model=fp8, runtime={"engine": "vllm"}))[0] == 201


def test_blocking_schema_error_skips_cel_and_says_so(http, isvc_crd):
    spec = isvc(accelerator={"count": 100})["spec"]
    spec["slo"]["ttftP99Ms"] = "fast"
    code, body = http.post(ISVCS, {**isvc(), "spec": spec})
    assert code == 422
    assert causes(body) == [("spec.slo.ttftP99Ms", "FieldValueTypeInvalid", 'Invalid value: "string": '
                             'spec.slo.ttftP99Ms in body must be of type number: "string"'), SKIPPED]
    assert COUNT_RULE not in body["message"]


@pytest.mark.parametrize("spec_change,field", [
    ({"runtime": {"engine": "tgi"}}, "spec.runtime.engine"),          # enum
    ({"model": {"source": "builtin:smollm2-135m"}}, "spec.model.name"),   # required
])
def test_enum_and_required_errors_block_cel(http, isvc_crd, spec_change, field):
    body = isvc(accelerator={"count": 100})
    body["spec"].update(spec_change)
    code, out = http.post(ISVCS, body)
    assert code == 422 and field in [c[0] for c in causes(out)] and SKIPPED in causes(out)
    assert COUNT_RULE not in out["message"]


def test_non_blocking_schema_error_and_cel_are_both_reported(http, isvc_crd):
    body = isvc(accelerator={"count": 100})
    body["spec"]["slo"]["ttftP99Ms"] = 0
    code, out = http.post(ISVCS, body)
    assert code == 422
    assert [c[0] for c in causes(out)] == ["spec.slo.ttftP99Ms", "spec.accelerator.count"]


def test_rule_reason_field_path_and_message_expression(http):
    rule = {"rule": "self.replicas <= 10", "reason": "FieldValueForbidden", "fieldPath": ".replicas",
            "messageExpression": "'replicas ' + string(self.replicas) + ' is above 10'"}
    http.ok("post", CRDS, with_rules(rule, replicas={"type": "integer"}))
    code, body = http.post(GADGETS, gadget(replicas=12))
    assert code == 422 and causes(body) == [("spec.replicas", "FieldValueForbidden",
                                             "Forbidden: replicas 12 is above 10")]


def test_transition_rule_runs_on_update_only(http):
    http.ok("post", CRDS, with_rules({"rule": "self.name == oldSelf.name", "message": "name is immutable"},
                                     name={"type": "string"}))
    http.ok("post", GADGETS, gadget(name="a"))
    code, body = http.patch(GADGETS + "/g1", {"spec": {"name": "b"}})
    assert code == 422 and body["message"].endswith("spec: Invalid value: name is immutable")


def test_runtime_errors_are_reported_with_the_rule(http):
    http.ok("post", CRDS, with_rules({"rule": "self.a > 1"}, a={"type": "integer"}, b={"type": "string"}))
    code, body = http.post(GADGETS, gadget(b="x"))
    assert code == 422 and causes(body) == [("spec", "FieldValueInvalid",
                                             'Invalid value: "object": no such key: a evaluating rule: self.a > 1')]


def test_number_fields_are_doubles_in_rules(http):
    http.ok("post", CRDS, with_rules({"rule": "self.f * 2.0 == 2.0"}, f={"type": "number"}))
    assert http.post(GADGETS, gadget(f=1))[0] == 201


def test_kubernetes_library_functions_are_available(http):
    http.ok("post", CRDS, with_rules({"rule": "self.tags.isSorted() && self.name.lowerAscii() == 'abc' && "
                                              "self.name.indexOf('B') == 1"},
                                     tags={"type": "array", "maxItems": 8, "items": {"type": "string"}},
                                     name={"type": "string", "maxLength": 8}))
    assert http.post(GADGETS, gadget(tags=["a", "b"], name="aBc"))[0] == 201


# ---------------------------------------------------------------- the CRD itself
RULE_PATH = "spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule"


@pytest.mark.parametrize("rule,detail", [
    ("self.a +", "compilation failed: ERROR: <input>:1:9: Syntax error"),
    ("other.a == 1", "undeclared reference to 'other'"),
    ("quantity(self.a).isGreaterThan(quantity('1'))", "undeclared reference to 'quantity'"),
])
def test_crd_whose_cel_does_not_compile_is_refused(http, rule, detail):
    code, body = http.post(CRDS, with_rules({"rule": rule}, a={"type": "string"}))
    assert code == 422 and body["reason"] == "Invalid"
    [(field, reason, message)] = causes(body)
    assert (field, reason) == (RULE_PATH, "FieldValueInvalid") and detail in message
    assert http.get(CRDS + "/gadgets.example.specfleet.io")[0] == 404


def test_nested_comprehensions_over_unbounded_lists_exceed_the_static_cost_limit(http):
    rule = {"rule": "self.xs.all(a, self.xs.all(b, a != b || a == b))"}
    code, body = http.post(CRDS, with_rules(rule, xs={"type": "array", "items": {"type": "string"}}))
    assert code == 422
    hint = ("(try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and "
            "strings are declared)")
    assert causes(body) == [
        (RULE_PATH, "FieldValueForbidden", f"Forbidden: estimated rule cost exceeds budget by factor of more than "
                                           f"100x {hint}"),
        ("spec.versions[0].schema.openAPIV3Schema", "FieldValueForbidden", "Forbidden: x-kubernetes-validations "
         f"estimated rule cost total for entire OpenAPIv3 schema exceeds budget by factor of more than 100x {hint}")]


def test_bounded_lists_fit_the_static_limit_and_the_per_call_limit_still_holds(http):
    rule = {"rule": "self.xs.all(a, self.xs.all(b, a != b || a == b))"}
    http.ok("post", CRDS, with_rules(rule, xs={"type": "array", "maxItems": 400, "items": {"type": "integer"}}))
    assert http.post(GADGETS, gadget(xs=list(range(10))))[0] == 201
    code, body = http.patch(GADGETS + "/g1", {"spec": {"xs": list(range(400))}})
    assert code == 422 and "no further validation rules will be run due to call cost exceeds limit" in body["message"]


@pytest.mark.parametrize("schema,field,message", [
    (spec_schema(size={"description": "no type"}),
     "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[size].type",
     "Required value: must not be empty for specified object fields"),
    (spec_schema(tags={"type": "array", "items": {"description": "no type"}}),
     "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[tags].items.type",
     "Required value: must not be empty for specified array items"),
    ({"type": "object", "properties": {"spec": {"type": "object", "properties": {"a": {"type": "string"}},
                                                "additionalProperties": {"type": "string"}}}},
     "spec.versions[0].schema.openAPIV3Schema.properties[spec].additionalProperties",
     "Forbidden: additionalProperties and properties are mutual exclusive"),
    (spec_schema(tags={"type": "array", "uniqueItems": True, "items": {"type": "string"}}),
     "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[tags].uniqueItems",
     "Forbidden: uniqueItems cannot be set to true since the runtime complexity becomes quadratic"),
    (spec_schema(ref={"$ref": "#/definitions/x"}),
     "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[ref].$ref",
     "Forbidden: $ref is not supported"),
    ({"type": "string"}, "spec.versions[0].schema.openAPIV3Schema.type",
     'Invalid value: "string": must be object at the root'),
])
def test_crd_with_a_non_structural_schema_is_refused(http, schema, field, message):
    code, body = http.post(CRDS, crd_with(schema))
    assert code == 422 and (field, message) in [(f, m) for f, _, m in causes(body)]
    assert http.get(CRDS + "/gadgets.example.specfleet.io")[0] == 404


def test_the_project_crd_is_accepted_and_established(http, isvc_crd):
    conditions = {c["type"]: c["status"] for c in isvc_crd["status"]["conditions"]}
    assert conditions == {"NamesAccepted": "True", "Established": "True"}


def test_crd_with_a_conversion_webhook_is_refused_rather_than_served_unconverted(http):
    body = crd_with(spec_schema(a={"type": "string"}))
    body["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {"conversionReviewVersions": ["v1"]}}
    code, out = http.post(CRDS, body)
    assert code == 422 and causes(out)[0][:2] == ("spec.conversion.strategy", "FieldValueNotSupported")
