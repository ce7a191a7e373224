"""Every verb on every subresource: the ones a real server routes, and the 405/404 it gives for the rest.

A DELETE on `.../status` must never delete the object (and let garbage collection take its children)."""
import json

import pytest

from tests.cluster.conftest import CONFIGMAPS, DEPLOYMENTS, WIDGETS, configmap, widget
from tests.cluster.conformance.helpers import ISVCS, METHOD_NOT_ALLOWED, deployment, isvc

RS = "/apis/apps/v1/namespaces/default/replicasets"


@pytest.fixture
def objects(http, crd, isvc_crd):
    http.ok("post", WIDGETS, widget("w1"))
    http.ok("post", DEPLOYMENTS, deployment("web"))
    http.ok("post", ISVCS, isvc("s1"))
    return {"widget": WIDGETS + "/w1", "deployment": DEPLOYMENTS + "/web", "isvc": ISVCS + "/s1"}


@pytest.mark.parametrize("kind", ["widget", "deployment", "isvc"])
@pytest.mark.parametrize("sub", ["status", "scale"])
@pytest.mark.parametrize("method", ["DELETE", "POST"])
def test_subresources_refuse_delete_and_post_with_405(http, objects, kind, sub, method):
    code, body = http.call(method, objects[kind] + "/" + sub, {} if method == "POST" else None)
    assert (code, body) == (405, METHOD_NOT_ALLOWED)
    assert http.get(objects[kind])[0] == 200


def test_delete_on_status_leaves_the_owner_and_its_children(http, objects):
    owner = http.ok("get", objects["deployment"])
    ref = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": owner["metadata"]["uid"]}
    http.ok("post", RS, {"apiVersion": "apps/v1", "kind": "ReplicaSet",
                         "metadata": {"name": "web-1", "ownerReferences": [ref]}, "spec": {"replicas": 1}})
    assert http.delete(objects["deployment"] + "/status")[0] == 405
    assert http.get(RS + "/web-1")[0] == 200


@pytest.mark.parametrize("kind", ["widget", "deployment", "isvc"])
@pytest.mark.parametrize("sub", ["status", "scale"])
def test_subresources_serve_get_put_patch(http, objects, kind, sub):
    current = http.ok("get", objects[kind] + "/" + sub)
    assert http.put(objects[kind] + "/" + sub, current)[0] == 200
    body = {"spec": {"replicas": 2}} if sub == "scale" else {"status": {"replicas": 1}}
    assert http.patch(objects[kind] + "/" + sub, body)[0] == 200


@pytest.mark.parametrize("method", ["PUT", "PATCH"])
def test_collections_refuse_put_and_patch(http, method):
    code, body = http.call(method, CONFIGMAPS, json.dumps(configmap("a")),
                           ctype="application/merge-patch+json" if method == "PATCH" else "application/json")
    assert (code, body) == (405, METHOD_NOT_ALLOWED)


def test_post_to_a_named_object_is_405(http):
    http.ok("post", CONFIGMAPS, configmap("a"))
    assert http.post(CONFIGMAPS + "/a", configmap("a")) == (405, METHOD_NOT_ALLOWED)


@pytest.mark.parametrize("path", [CONFIGMAPS + "/a/status", CONFIGMAPS + "/a/scale", DEPLOYMENTS + "/web/log",
                                  "/api/v1/namespaces/default/nothings"])
def test_unknown_subresources_and_resources_are_404(http, path):
    http.ok("post", CONFIGMAPS, configmap("a"))
    code, body = http.get(path)
    assert code == 404 and body["reason"] == "NotFound"


def test_status_writes_change_only_status_and_main_writes_keep_status(http, objects):
    http.ok("patch", objects["widget"] + "/status", {"status": {"phase": "Ready"}, "spec": {"size": "large"}})
    after = http.ok("get", objects["widget"])
    assert after["status"]["phase"] == "Ready" and after["spec"]["size"] == "small"
    http.ok("patch", objects["widget"], {"spec": {"size": "large"}, "status": {"phase": "Gone"}})
    assert http.ok("get", objects["widget"])["status"]["phase"] == "Ready"
