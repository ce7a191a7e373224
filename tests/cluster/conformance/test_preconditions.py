"""Preconditions and request options: resourceVersion on update, uid/resourceVersion on delete, and the
options a real server validates before it touches the object (fieldManager, force, fieldValidation)."""
import json

import pytest

from tests.cluster.conftest import CONFIGMAPS, DEPLOYMENTS, WIDGETS, configmap, widget
from tests.cluster.conformance.helpers import deployment

CONFLICT_WHY = "the object has been modified; please apply your changes to the latest version and try again"


def test_custom_resource_put_without_resource_version_is_422(http, crd):
    created = http.ok("post", WIDGETS, widget())
    del created["metadata"]["resourceVersion"]
    code, body = http.put(WIDGETS + "/w1", created)
    assert code == 422 and body["reason"] == "Invalid"
    assert body["message"] == ('Widget.example.specfleet.io "w1" is invalid: metadata.resourceVersion: Invalid value: '
                               "0x0: must be specified for an update")


def test_custom_resource_status_put_without_resource_version_is_422(http, crd):
    created = http.ok("post", WIDGETS, widget())
    del created["metadata"]["resourceVersion"]
    assert http.put(WIDGETS + "/w1/status", {**created, "status": {"phase": "x"}})[0] == 422


def test_builtin_put_without_resource_version_is_unconditional(http):
    created = http.ok("post", CONFIGMAPS, configmap("a", x="1"))
    del created["metadata"]["resourceVersion"]
    assert http.put(CONFIGMAPS + "/a", {**created, "data": {"x": "2"}})[0] == 200


@pytest.mark.parametrize("path,make", [(CONFIGMAPS, lambda: configmap("a")), (WIDGETS, lambda: widget("a"))])
def test_put_with_a_stale_resource_version_is_409_conflict(http, crd, path, make):
    stale = http.ok("post", path, make())
    http.ok("patch", path + "/a", {"metadata": {"labels": {"x": "y"}}})
    code, body = http.put(path + "/a", stale)
    assert code == 409 and body["reason"] == "Conflict" and body["message"].endswith(CONFLICT_WHY)


def test_patch_carrying_a_stale_resource_version_is_409(http):
    http.ok("post", CONFIGMAPS, configmap("a"))
    code, body = http.patch(CONFIGMAPS + "/a", {"metadata": {"resourceVersion": "1"}, "data": {"x": "1"}})
    assert code == 409 and body["message"] == f'Operation cannot be fulfilled on configmaps "a": {CONFLICT_WHY}'


def test_delete_precondition_on_uid_is_409(http):
    http.ok("post", CONFIGMAPS, configmap("a"))
    code, body = http.delete(CONFIGMAPS + "/a", {"preconditions": {"uid": "nope"}})
    assert code == 409 and "Precondition failed: UID in precondition: nope" in body["message"]
    assert http.get(CONFIGMAPS + "/a")[0] == 200


def test_delete_precondition_on_resource_version_is_409(http):
    obj = http.ok("post", CONFIGMAPS, configmap("a"))
    code, body = http.delete(CONFIGMAPS + "/a", {"preconditions": {"resourceVersion": "1"}})
    assert code == 409 and body["message"] == (
        'Operation cannot be fulfilled on configmaps "a": Precondition failed: ResourceVersion in precondition: 1, '
        f'ResourceVersion in object meta: {obj["metadata"]["resourceVersion"]}')


def test_apply_without_field_manager_is_422(http):
    code, body = http.patch(DEPLOYMENTS + "/web", json.dumps(deployment()), kind="apply")
    assert code == 422 and body["details"] == {"name": "", "group": "meta.k8s.io", "kind": "PatchOptions", "causes": [
        {"reason": "FieldValueRequired", "message": "Required value: is required for apply patch",
         "field": "fieldManager"}]}
    assert http.get(DEPLOYMENTS + "/web")[0] == 404


@pytest.mark.parametrize("force", ["true", "false"])
@pytest.mark.parametrize("kind", ["merge", "json", "strategic"])
def test_force_on_a_non_apply_patch_is_422(http, force, kind):
    http.ok("post", CONFIGMAPS, configmap("a"))
    body = [{"op": "add", "path": "/data", "value": {}}] if kind == "json" else {"data": {"x": "1"}}
    code, out = http.patch(CONFIGMAPS + "/a", body, kind=kind, force=force)
    assert code == 422 and out["message"] == ('PatchOptions.meta.k8s.io "" is invalid: force: Forbidden: may not be '
                                              "specified for non-apply patch")


def test_unknown_field_validation_directive_is_400(http):
    code, body = http.post(CONFIGMAPS, configmap("a"), fieldValidation="Loose")
    assert code == 400 and "fieldValidation" in body["message"]
    assert http.get(CONFIGMAPS + "/a")[0] == 404


def test_field_manager_longer_than_128_is_422(http):
    code, body = http.post(CONFIGMAPS, configmap("a"), fieldManager="m" * 129)
    assert code == 422 and "fieldManager: Too long: may not be more than 128 bytes" in body["message"]


def test_dry_run_validates_but_stores_nothing(http):
    out = http.ok("post", CONFIGMAPS, configmap("a"), dryRun="All")
    assert out["metadata"]["name"] == "a" and http.get(CONFIGMAPS + "/a")[0] == 404
