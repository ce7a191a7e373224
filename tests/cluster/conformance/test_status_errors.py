"""The Status bodies of the common failures, word for word: 404, 409 AlreadyExists, 400 for a body that does
not fit the URL, 403 in a terminating namespace, 415 for media types a real server does not take there."""
import json

import pytest

from tests.cluster.conftest import CONFIGMAPS, DEPLOYMENTS, WIDGETS, configmap, widget


def status(code, reason, message, details=None):
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}
    return {**body, "details": details} if details else body


def test_get_missing_is_404_not_found(http):
    assert http.get(DEPLOYMENTS + "/nope") == (404, status(404, "NotFound", 'deployments.apps "nope" not found',
                                                           {"name": "nope", "group": "apps", "kind": "deployments"}))


def test_create_twice_is_409_already_exists(http):
    http.ok("post", CONFIGMAPS, configmap("a"))
    assert http.post(CONFIGMAPS, configmap("a")) == (409, status(409, "AlreadyExists", 'configmaps "a" already exists',
                                                                 {"name": "a", "group": "", "kind": "configmaps"}))


def test_create_in_a_missing_namespace_is_404(http):
    code, body = http.post("/api/v1/namespaces/ghost/configmaps", configmap("a"))
    assert (code, body["message"]) == (404, 'namespaces "ghost" not found')


def test_create_in_a_terminating_namespace_is_403(http):
    http.ok("post", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gone"}})
    http.ok("post", "/api/v1/namespaces/gone/configmaps",
            {**configmap("hold"), "metadata": {"name": "hold", "finalizers": ["example.io/hold"]}})
    http.delete("/api/v1/namespaces/gone")
    code, body = http.post("/api/v1/namespaces/gone/configmaps", configmap("a"))
    assert (code, body["reason"]) == (403, "Forbidden")
    assert body["message"].endswith("unable to create new content in namespace gone because it is being terminated")


def test_body_namespace_that_differs_from_the_url_is_400(http):
    body = {**configmap("a"), "metadata": {"name": "a", "namespace": "kube-system"}}
    code, out = http.post(CONFIGMAPS, body)
    assert (code, out["message"]) == (400, "the namespace of the provided object does not match the namespace sent "
                                            "on the request")


def test_body_name_that_differs_from_the_url_on_update_is_400(http):
    created = http.ok("post", CONFIGMAPS, configmap("a"))
    code, out = http.put(CONFIGMAPS + "/a", {**created, "metadata": {**created["metadata"], "name": "b"}})
    assert code == 400 and out["reason"] == "BadRequest"


def test_strategic_merge_patch_on_a_custom_resource_is_415(http, crd):
    http.ok("post", WIDGETS, widget())
    code, body = http.patch(WIDGETS + "/w1", {"spec": {"size": "large"}}, kind="strategic")
    assert (code, body["reason"]) == (415, "UnsupportedMediaType")


def test_unknown_patch_media_type_is_415(http):
    http.ok("post", CONFIGMAPS, configmap("a"))
    code, body = http.call("PATCH", CONFIGMAPS + "/a", json.dumps({"data": {}}), ctype="application/xml")
    assert (code, body["reason"]) == (415, "UnsupportedMediaType")


def test_protobuf_bodies_are_refused_with_415(http):
    code, body = http.call("POST", CONFIGMAPS, b"\x6b\x38\x73\x00", ctype="application/vnd.kubernetes.protobuf")
    assert (code, body["reason"]) == (415, "UnsupportedMediaType")


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]"])
def test_undecodable_bodies_are_400(http, body):
    code, out = http.call("POST", CONFIGMAPS, body)
    assert code == 400 and out["reason"] == "BadRequest"
