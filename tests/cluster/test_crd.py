"""Custom resources: schema validation with field paths, defaults, pruning, CEL rules, printer columns."""
from tests.cluster.conftest import WIDGETS, widget

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


def causes(body):
    return {(c["field"], c["reason"]) for c in body["details"]["causes"]}


def test_defaults_are_applied_and_unknown_fields_pruned(http, crd):
    w = widget(extra={"anything": {"goes": 1}}, bogus=1)
    w["junk"] = True
    out = http.ok("post", WIDGETS, w)
    assert out["spec"]["replicas"] == 1 and out["spec"]["method"] == "ngram"
    assert "bogus" not in out["spec"] and "junk" not in out
    assert out["spec"]["extra"] == {"anything": {"goes": 1}}


def test_strict_field_validation_rejects_unknown_fields(http, crd):
    code, body = http.post(WIDGETS, widget(bogus=1), fieldValidation="Strict")
    assert code == 400 and 'unknown field "spec.bogus"' in body["message"]


def test_schema_errors_are_422_with_field_paths(http, crd):
    bad = widget(size="huge", replicas="two", tags=["a", "b", "c", "d"])
    bad["spec"]["name"] = "TOO-LONG-NAME"
    code, body = http.post(WIDGETS, bad)
    assert code == 422 and body["reason"] == "Invalid"
    assert {("spec.size", "FieldValueNotSupported"), ("spec.replicas", "FieldValueTypeInvalid"),
            ("spec.name", "FieldValueTooLong"), ("spec.tags", "FieldValueTooMany")} <= causes(body)
    assert 'Widget.example.specfleet.io "w1" is invalid' in body["message"]
    assert 'spec.size: Unsupported value: "huge"' in body["message"]
    code, body = http.post(WIDGETS, {**widget(), "spec": {"replicas": -1}})
    assert ("spec.size", "FieldValueRequired") in causes(body)
    assert "should be greater than or equal to 0" in body["message"]


def test_cel_rules(http, crd):
    code, body = http.post(WIDGETS, widget(minReplicas=5, maxReplicas=2))
    assert code == 422 and "minReplicas must not exceed maxReplicas" in body["message"]
    assert ("spec", "FieldValueInvalid") in causes(body)
    code, body = http.post(WIDGETS, widget(method="draft"))
    assert code == 422 and "failed rule: self.method != 'draft' || has(self.draftModel)" in body["message"]
    assert http.post(WIDGETS, widget(method="draft", draftModel="tiny"))[0] == 201


def test_validation_applies_to_updates_and_patches(http, crd):
    http.ok("post", WIDGETS, widget())
    code, body = http.patch(WIDGETS + "/w1", {"spec": {"size": "xl"}})
    assert code == 422 and ("spec.size", "FieldValueNotSupported") in causes(body)


def test_printer_columns_are_served_as_a_table(http, crd):
    http.ok("post", WIDGETS, widget(replicas=3))
    http.ok("patch", WIDGETS + "/w1/status", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    code, tbl = http.get(WIDGETS, headers={"Accept": TABLE})
    assert tbl["kind"] == "Table"
    assert [c["name"] for c in tbl["columnDefinitions"]] == ["Name", "Size", "Replicas", "Ready", "Age"]
    assert tbl["rows"][0]["cells"][:4] == ["w1", "small", 3, "True"]
    assert tbl["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
    _, one = http.get(WIDGETS + "/w1", headers={"Accept": TABLE})
    assert one["rows"][0]["cells"][0] == "w1"


def test_builtin_tables_have_name_and_age(http):
    _, tbl = http.get("/api/v1/namespaces", headers={"Accept": TABLE})
    assert [c["name"] for c in tbl["columnDefinitions"]] == ["Name", "Status", "Age"]


def test_field_selectors_on_custom_resources_are_limited(http, crd):
    http.ok("post", WIDGETS, widget())
    assert len(http.ok("get", WIDGETS, fieldSelector="metadata.name=w1")["items"]) == 1
    assert http.get(WIDGETS, fieldSelector="spec.size=small")[0] == 400
