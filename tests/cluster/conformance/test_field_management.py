"""Field management: server-side apply ownership and conflicts, Update entries, and fieldValidation on
custom resources (Warn is the server's default, Strict refuses, Ignore is silent)."""
import json

import requests

from tests.cluster.conftest import CONFIGMAPS, WIDGETS, configmap, widget


def apply(http, path, body, manager, **params):
    return http.patch(path, json.dumps(body), kind="apply", fieldManager=manager, **params)


def managers(obj):
    return {(e["manager"], e["operation"]) for e in obj["metadata"]["managedFields"]}


def test_apply_conflict_is_409_with_field_manager_causes(http):
    apply(http, CONFIGMAPS + "/a", configmap("a", x="1"), "alpha")
    code, body = apply(http, CONFIGMAPS + "/a", configmap("a", x="2"), "beta")
    assert (code, body["reason"]) == (409, "Conflict")
    assert body["message"] == 'Apply failed with 1 conflict: conflict with "alpha" using v1: .data.x'
    assert body["details"] == {"causes": [{"reason": "FieldManagerConflict",
                                           "message": 'conflict with "alpha" using v1', "field": ".data.x"}]}


def test_force_takes_ownership(http):
    apply(http, CONFIGMAPS + "/a", configmap("a", x="1"), "alpha")
    code, out = apply(http, CONFIGMAPS + "/a", configmap("a", x="2"), "beta", force="true")
    assert code == 200 and out["data"]["x"] == "2"
    owners = {e["manager"]: e["fieldsV1"] for e in out["metadata"]["managedFields"]}
    assert "f:x" in owners["beta"]["f:data"] and "f:data" not in owners.get("alpha", {})


def test_updates_are_recorded_under_the_field_manager(http):
    http.ok("post", CONFIGMAPS, configmap("a", x="1"), fieldManager="creator")
    out = http.ok("patch", CONFIGMAPS + "/a", {"data": {"y": "2"}}, fieldManager="patcher")
    assert managers(out) == {("creator", "Update"), ("patcher", "Update")}


def test_apply_on_the_status_subresource_is_recorded_with_it(http, crd):
    http.ok("post", WIDGETS, widget())
    body = {"apiVersion": "example.specfleet.io/v1", "kind": "Widget", "metadata": {"name": "w1"},
            "status": {"phase": "Ready"}}
    out = apply(http, WIDGETS + "/w1/status", body, "ctrl")[1]
    entry = next(e for e in out["metadata"]["managedFields"] if e["manager"] == "ctrl")
    assert entry["operation"] == "Apply" and entry["subresource"] == "status"


def test_unknown_custom_resource_fields_warn_by_default(http, crd):
    response = requests.post(http.url + WIDGETS, json=widget(bogus=1), timeout=10)
    assert response.status_code == 201 and response.headers["Warning"] == '299 - "unknown field \\"spec.bogus\\""'
    assert "bogus" not in response.json()["spec"]


def test_unknown_custom_resource_fields_are_refused_under_strict(http, crd):
    code, body = http.post(WIDGETS, widget(bogus=1), fieldValidation="Strict")
    assert code == 400 and body["message"] == ('Widget in version "v1" cannot be handled as a Widget: strict decoding '
                                               'error: unknown field "spec.bogus"')


def test_ignore_prunes_without_a_warning(http, crd):
    response = requests.post(http.url + WIDGETS, json=widget(bogus=1), params={"fieldValidation": "Ignore"},
                             timeout=10)
    assert response.status_code == 201 and "Warning" not in response.headers
