"""Patches: JSON merge patch, JSON patch, strategic merge patch (keyed lists), over HTTP and as functions."""
from specfleet.cluster.apiserver.patch import json_patch, merge_patch, strategic_merge
from tests.cluster.conftest import CONFIGMAPS, DEPLOYMENTS, configmap, manifest


def test_merge_patch_sets_and_removes_keys():
    assert merge_patch({"a": 1, "b": {"c": 2, "d": 3}}, {"a": None, "b": {"c": 9}}) == {"b": {"c": 9, "d": 3}}


def test_json_patch_operations():
    doc = {"a": [1, 2], "b": {"c": 1}}
    out = json_patch(doc, [{"op": "add", "path": "/a/-", "value": 3}, {"op": "replace", "path": "/b/c", "value": 2},
                           {"op": "copy", "from": "/b", "path": "/d"}, {"op": "remove", "path": "/a/0"},
                           {"op": "test", "path": "/d/c", "value": 2}])
    assert out == {"a": [2, 3], "b": {"c": 2}, "d": {"c": 2}} and doc["a"] == [1, 2]


def test_strategic_merge_merges_lists_by_name():
    pod = {"containers": [{"name": "a", "image": "x", "env": [{"name": "E", "value": "1"}]}, {"name": "b"}]}
    patch = {"containers": [{"name": "a", "env": [{"name": "F", "value": "2"}]}, {"name": "c", "image": "z"},
                            {"name": "b", "$patch": "delete"}]}
    out = strategic_merge(pod, patch)
    assert [c["name"] for c in out["containers"]] == ["a", "c"]
    assert out["containers"][0]["image"] == "x"
    assert [e["name"] for e in out["containers"][0]["env"]] == ["E", "F"]


def test_strategic_merge_ports_and_directives():
    out = strategic_merge({"ports": [{"containerPort": 80, "name": "http"}], "finalizers": ["a"]},
                          {"ports": [{"containerPort": 80, "name": "web"}, {"containerPort": 90}],
                           "finalizers": ["b"], "$setElementOrder/ports": [{"containerPort": 90},
                                                                            {"containerPort": 80}]})
    assert out["ports"] == [{"containerPort": 90}, {"containerPort": 80, "name": "web"}]
    assert out["finalizers"] == ["a", "b"]


def test_patch_types_over_http(http):
    http.ok("post", DEPLOYMENTS, manifest("deployment.yaml"))
    patch = {"spec": {"template": {"spec": {"containers": [{"name": "app", "image": "nginx:2"}]}}}}
    out = http.ok("patch", DEPLOYMENTS + "/web", patch, kind="strategic")
    images = [c["image"] for c in out["spec"]["template"]["spec"]["containers"]]
    assert images == ["nginx:2", "busybox"]
    out = http.ok("patch", DEPLOYMENTS + "/web", [{"op": "replace", "path": "/spec/replicas", "value": 7}],
                  kind="json")
    assert out["spec"]["replicas"] == 7
    out = http.ok("patch", DEPLOYMENTS + "/web", patch, kind="merge")
    assert len(out["spec"]["template"]["spec"]["containers"]) == 1


def test_patch_errors(http, crd):
    http.ok("post", CONFIGMAPS, configmap("a"))
    code, _ = http.patch(CONFIGMAPS + "/a", [{"op": "test", "path": "/data/x", "value": "1"}], kind="json")
    assert code == 422
    assert http.patch(CONFIGMAPS + "/nope", {"data": {}})[0] == 404
    code, _ = http.patch(CONFIGMAPS + "/a", {"metadata": {"resourceVersion": "1"}})
    assert code == 409
    http.ok("post", "/apis/example.specfleet.io/v1/namespaces/default/widgets",
            {"apiVersion": "example.specfleet.io/v1", "kind": "Widget", "metadata": {"name": "w"},
             "spec": {"size": "small"}})
    code, body = http.patch("/apis/example.specfleet.io/v1/namespaces/default/widgets/w", {}, kind="strategic")
    assert code == 415 and body["reason"] == "UnsupportedMediaType"
