"""Deletion and finalizers: what changes when deletion starts, and what may not change after."""

from tests.cluster.conftest import CONFIGMAPS, DEPLOYMENTS, WIDGETS, widget
from tests.cluster.conformance.helpers import deployment
from tests.cluster.test_delete_gc import eventually


def test_generation_bumps_when_deletion_starts(http, crd):
    http.ok("post", WIDGETS, {**widget(), "metadata": {"name": "w1", "finalizers": ["example.io/hold"]}})
    code, deleting = http.delete(WIDGETS + "/w1")
    assert code == 202 and deleting["metadata"]["generation"] == 2 and deleting["metadata"]["deletionTimestamp"]
    again = http.delete(WIDGETS + "/w1")[1]
    assert again["metadata"]["generation"] == 2


def test_generation_of_a_builtin_bumps_when_deletion_starts(http):
    body = deployment()
    body["metadata"]["finalizers"] = ["example.io/hold"]
    http.ok("post", DEPLOYMENTS, body)
    assert http.delete(DEPLOYMENTS + "/web")[1]["metadata"]["generation"] == 2


def test_kinds_without_generation_get_none_on_deletion(http):
    http.ok("post", CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap",
                                 "metadata": {"name": "a", "finalizers": ["example.io/hold"]}})
    assert "generation" not in http.delete(CONFIGMAPS + "/a")[1]["metadata"]


def test_spec_writes_during_deletion_are_kept_and_removing_the_finalizer_deletes(http, crd):
    http.ok("post", WIDGETS, {**widget(), "metadata": {"name": "w1", "finalizers": ["example.io/hold"]}})
    http.delete(WIDGETS + "/w1")
    http.ok("patch", WIDGETS + "/w1", {"metadata": {"finalizers": None}})
    assert http.get(WIDGETS + "/w1")[0] == 404


def test_no_new_finalizers_while_deleting(http, crd):
    http.ok("post", WIDGETS, {**widget(), "metadata": {"name": "w1", "finalizers": ["a/b"]}})
    http.delete(WIDGETS + "/w1")
    code, body = http.patch(WIDGETS + "/w1", {"metadata": {"finalizers": ["a/b", "c/d"]}})
    assert code == 422 and body["details"]["causes"][0]["field"] == "metadata.finalizers"


def test_delete_without_finalizers_is_200_and_the_object_is_gone(http):
    http.ok("post", DEPLOYMENTS, deployment())
    code, body = http.delete(DEPLOYMENTS + "/web")
    assert code == 200 and body["metadata"]["name"] == "web"
    assert http.get(DEPLOYMENTS + "/web")[0] == 404


def test_foreground_deletion_waits_for_blocking_dependents(http):
    owner = http.ok("post", DEPLOYMENTS, deployment())
    ref = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": owner["metadata"]["uid"],
           "blockOwnerDeletion": True}
    http.ok("post", "/apis/apps/v1/namespaces/default/replicasets",
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "web-1", "ownerReferences": [ref]},
             "spec": {"replicas": 1}})
    code, body = http.delete(DEPLOYMENTS + "/web", {"propagationPolicy": "Foreground"})
    assert code == 202 and "foregroundDeletion" in body["metadata"]["finalizers"]
    assert eventually(lambda: http.get(DEPLOYMENTS + "/web")[0] == 404)
