"""Status and scale subresources."""
from tests.cluster.conftest import DEPLOYMENTS, WIDGETS, manifest, widget


def test_status_writes_change_only_status(http, crd):
    http.ok("post", WIDGETS, {**widget(), "status": {"phase": "ignored-on-create"}})
    out = http.ok("patch", WIDGETS + "/w1/status", {"status": {"phase": "Ready"}, "spec": {"size": "large"},
                                                   "metadata": {"labels": {"x": "y"}}})
    assert out["status"] == {"phase": "Ready"} and out["spec"]["size"] == "small"
    assert "labels" not in out["metadata"] and out["metadata"]["generation"] == 1


def test_main_resource_writes_ignore_status_and_bump_generation_on_spec(http, crd):
    created = http.ok("post", WIDGETS, {**widget(), "status": {"phase": "x"}})
    assert "status" not in created
    http.ok("patch", WIDGETS + "/w1/status", {"status": {"phase": "Ready"}})
    out = http.ok("patch", WIDGETS + "/w1", {"status": {"phase": "Hacked"}, "metadata": {"labels": {"a": "b"}}})
    assert out["status"]["phase"] == "Ready" and out["metadata"]["generation"] == 1
    out = http.ok("patch", WIDGETS + "/w1", {"spec": {"size": "large"}})
    assert out["metadata"]["generation"] == 2


def test_put_to_status(http, crd):
    obj = http.ok("post", WIDGETS, widget())
    obj["status"] = {"phase": "Put"}
    obj["spec"]["size"] = "large"
    out = http.ok("put", WIDGETS + "/w1/status", obj)
    assert out["status"]["phase"] == "Put" and out["spec"]["size"] == "small"


def test_deployment_scale_subresource(http):
    http.ok("post", DEPLOYMENTS, manifest("deployment.yaml"))
    scale = http.ok("get", DEPLOYMENTS + "/web/scale")
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 2 and scale["status"]["selector"] == "app=web"
    out = http.ok("patch", DEPLOYMENTS + "/web/scale", {"spec": {"replicas": 5}})
    assert out["spec"]["replicas"] == 5
    assert http.ok("get", DEPLOYMENTS + "/web")["spec"]["replicas"] == 5
    scale = http.ok("get", DEPLOYMENTS + "/web/scale")
    scale["spec"]["replicas"] = 1
    assert http.ok("put", DEPLOYMENTS + "/web/scale", scale)["spec"]["replicas"] == 1
    scale["metadata"]["resourceVersion"] = "1"
    assert http.put(DEPLOYMENTS + "/web/scale", scale)[0] == 409


def test_custom_resource_scale_subresource(http, crd):
    http.ok("post", WIDGETS, widget(replicas=2))
    http.ok("patch", WIDGETS + "/w1/status", {"status": {"replicas": 2, "selector": "app=w"}})
    scale = http.ok("get", WIDGETS + "/w1/scale")
    assert (scale["spec"]["replicas"], scale["status"]) == (2, {"replicas": 2, "selector": "app=w"})
    http.ok("patch", WIDGETS + "/w1/scale", {"spec": {"replicas": 4}})
    assert http.ok("get", WIDGETS + "/w1")["spec"]["replicas"] == 4
    assert http.get("/api/v1/namespaces/default/configmaps/x/scale")[0] == 404
