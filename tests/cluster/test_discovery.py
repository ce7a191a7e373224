"""Discovery: /api, /apis, group versions, resources with verbs, short names and subresources."""
from tests.cluster.conftest import widget


def test_core_and_group_discovery_list_builtin_kinds(http):
    _, versions = http.get("/api")
    assert versions["versions"] == ["v1"]
    _, core = http.get("/api/v1")
    names = {r["name"]: r for r in core["resources"]}
    assert {"pods", "services", "configmaps", "secrets", "events", "namespaces", "serviceaccounts",
            "endpoints", "pods/status"} <= set(names)
    assert names["namespaces"]["namespaced"] is False and names["pods"]["shortNames"] == ["po"]
    _, groups = http.get("/apis")
    group_names = {g["name"] for g in groups["groups"]}
    assert {"apps", "policy", "coordination.k8s.io", "rbac.authorization.k8s.io", "networking.k8s.io",
            "apiextensions.k8s.io", "events.k8s.io"} <= group_names
    _, apps = http.get("/apis/apps/v1")
    scale = next(r for r in apps["resources"] if r["name"] == "deployments/scale")
    assert scale["kind"] == "Scale" and scale["group"] == "autoscaling"


def test_crd_registration_appears_in_discovery_with_short_names(http, crd):
    assert crd["status"]["conditions"][-1]["type"] == "Established"
    _, gv = http.get("/apis/example.specfleet.io/v1")
    by_name = {r["name"]: r for r in gv["resources"]}
    assert by_name["widgets"]["shortNames"] == ["wd"] and by_name["widgets"]["kind"] == "Widget"
    assert {"widgets/status", "widgets/scale"} <= set(by_name)
    _, group = http.get("/apis/example.specfleet.io")
    assert group["preferredVersion"]["version"] == "v1"


def test_deleting_a_crd_unregisters_it_and_its_objects(http, crd):
    http.ok("post", "/apis/example.specfleet.io/v1/namespaces/default/widgets", widget())
    http.ok("delete", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.specfleet.io")
    assert http.get("/apis/example.specfleet.io/v1")[0] == 404
    assert http.get("/apis/example.specfleet.io/v1/namespaces/default/widgets/w1")[0] == 404


def test_unknown_paths_are_404_status_and_version_is_served(http):
    code, body = http.get("/apis/nope.io/v1/things")
    assert code == 404 and body["kind"] == "Status" and body["reason"] == "NotFound"
    assert http.get("/version")[1]["major"] == "1"
    _, index = http.get("/openapi/v3")
    assert "apis/apps/v1" in index["paths"]
