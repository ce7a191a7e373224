"""Deletion: finalizers and deletionTimestamp, propagation policies, owner-reference GC, namespaces."""
import time

from tests.cluster.conftest import CONFIGMAPS, DEPLOYMENTS, configmap, manifest

RS = "/apis/apps/v1/namespaces/default/replicasets"


def eventually(check, timeout=3.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def owned(name, owner, block=False):
    ref = {"apiVersion": "apps/v1", "kind": "Deployment", "name": owner["metadata"]["name"],
           "uid": owner["metadata"]["uid"], "blockOwnerDeletion": block}
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": name, "ownerReferences": [ref]}, "spec": {"replicas": 1}}


def test_finalizers_hold_deletion_until_removed(http):
    http.ok("post", CONFIGMAPS, {**configmap("a"), "metadata": {"name": "a", "finalizers": ["x/y"]}})
    code, obj = http.delete(CONFIGMAPS + "/a")
    assert code == 202 and obj["metadata"]["deletionTimestamp"]
    still = http.ok("get", CONFIGMAPS + "/a")
    assert still["metadata"]["finalizers"] == ["x/y"]
    code, body = http.patch(CONFIGMAPS + "/a", {"metadata": {"finalizers": ["x/y", "new"]}})
    assert code == 422 and "no new finalizers" in body["message"]
    http.ok("patch", CONFIGMAPS + "/a", {"metadata": {"finalizers": None}})
    assert http.get(CONFIGMAPS + "/a")[0] == 404


def test_delete_preconditions(http):
    http.ok("post", CONFIGMAPS, configmap("a"))
    code, _ = http.delete(CONFIGMAPS + "/a", {"preconditions": {"resourceVersion": "1"}})
    assert code == 409


def test_background_propagation_deletes_dependents(http):
    owner = http.ok("post", DEPLOYMENTS, manifest("deployment.yaml"))
    http.ok("post", RS, owned("web-1", owner))
    http.ok("delete", DEPLOYMENTS + "/web", {"propagationPolicy": "Background"})
    assert http.get(DEPLOYMENTS + "/web")[0] == 404
    assert eventually(lambda: http.get(RS + "/web-1")[0] == 404)


def test_foreground_propagation_waits_for_blocking_dependents(http):
    owner = http.ok("post", DEPLOYMENTS, manifest("deployment.yaml"))
    dep = owned("web-1", owner, block=True)
    dep["metadata"]["finalizers"] = ["hold"]
    http.ok("post", RS, dep)
    http.ok("delete", DEPLOYMENTS + "/web", {"propagationPolicy": "Foreground"})
    assert eventually(lambda: http.ok("get", RS + "/web-1")["metadata"].get("deletionTimestamp"))
    pending = http.ok("get", DEPLOYMENTS + "/web")
    assert "foregroundDeletion" in pending["metadata"]["finalizers"]
    http.ok("patch", RS + "/web-1", {"metadata": {"finalizers": None}})
    assert eventually(lambda: http.get(DEPLOYMENTS + "/web")[0] == 404)


def test_orphan_propagation_keeps_dependents_without_the_reference(http):
    owner = http.ok("post", DEPLOYMENTS, manifest("deployment.yaml"))
    http.ok("post", RS, owned("web-1", owner))
    http.ok("delete", DEPLOYMENTS + "/web", propagationPolicy="Orphan")
    assert eventually(lambda: http.get(DEPLOYMENTS + "/web")[0] == 404)
    assert "ownerReferences" not in http.ok("get", RS + "/web-1")["metadata"]


def test_deleting_a_namespace_deletes_its_contents(http):
    http.ok("post", "/api/v1/namespaces", {"metadata": {"name": "team"}})
    http.ok("post", "/api/v1/namespaces/team/configmaps", configmap("a"))
    code, ns = http.delete("/api/v1/namespaces/team")
    assert ns["status"]["phase"] == "Terminating"
    assert eventually(lambda: http.get("/api/v1/namespaces/team")[0] == 404)
    assert http.get("/api/v1/namespaces/team/configmaps/a")[0] == 404


def test_delete_collection_by_label(http):
    http.ok("post", CONFIGMAPS, configmap("a", {"app": "x"}))
    http.ok("post", CONFIGMAPS, configmap("b", {"app": "y"}))
    http.ok("delete", CONFIGMAPS, labelSelector="app=x")
    assert [o["metadata"]["name"] for o in http.ok("get", CONFIGMAPS)["items"]] == ["b"]
