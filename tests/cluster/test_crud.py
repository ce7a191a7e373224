"""CRUD with server-set metadata, Status errors, and PUT resourceVersion conflicts."""
from tests.cluster.conftest import CONFIGMAPS, DEPLOYMENTS, configmap, manifest


def test_create_sets_server_metadata_and_namespace_from_url(http):
    obj = http.ok("post", CONFIGMAPS, configmap("a", x="1"))
    m = obj["metadata"]
    assert m["namespace"] == "default" and m["uid"] and m["creationTimestamp"].endswith("Z")
    assert int(m["resourceVersion"]) > 0 and "generation" not in m
    dep = http.ok("post", DEPLOYMENTS, manifest("deployment.yaml"))
    assert dep["metadata"]["generation"] == 1


def test_resource_version_is_a_global_counter(http):
    a = http.ok("post", CONFIGMAPS, configmap("a"))
    b = http.ok("post", "/api/v1/namespaces/default/secrets", {"metadata": {"name": "s"}, "kind": "Secret",
                                                                 "apiVersion": "v1"})
    assert int(b["metadata"]["resourceVersion"]) == int(a["metadata"]["resourceVersion"]) + 1


def test_generate_name_gives_unique_names(http):
    names = {http.ok("post", CONFIGMAPS, {"metadata": {"generateName": "job-"}})["metadata"]["name"]
             for _ in range(5)}
    assert len(names) == 5 and all(n.startswith("job-") and len(n) == 9 for n in names)


def test_errors_are_status_objects(http):
    http.ok("post", CONFIGMAPS, configmap("a"))
    code, body = http.post(CONFIGMAPS, configmap("a"))
    assert (code, body["reason"], body["kind"]) == (409, "AlreadyExists", "Status")
    code, body = http.get(CONFIGMAPS + "/missing")
    assert (code, body["message"]) == (404, 'configmaps "missing" not found')
    code, body = http.post(CONFIGMAPS, configmap("Bad_Name"))
    assert code == 422 and body["details"]["causes"][0]["field"] == "metadata.name"
    code, body = http.post("/api/v1/namespaces/nowhere/configmaps", configmap("a"))
    assert code == 404 and 'namespaces "nowhere" not found' in body["message"]
    code, body = http.post(CONFIGMAPS, {**configmap("b"), "metadata": {"name": "b", "namespace": "other"}})
    assert code == 400


def test_put_checks_resource_version(http):
    obj = http.ok("post", CONFIGMAPS, configmap("a", x="1"))
    stale = dict(obj)
    obj["data"] = {"x": "2"}
    updated = http.ok("put", CONFIGMAPS + "/a", obj)
    assert updated["data"] == {"x": "2"}
    assert int(updated["metadata"]["resourceVersion"]) > int(stale["metadata"]["resourceVersion"])
    code, body = http.put(CONFIGMAPS + "/a", {**stale, "data": {"x": "3"}})
    assert code == 409 and body["reason"] == "Conflict" and "has been modified" in body["message"]
    unconditional = {**updated, "metadata": {k: v for k, v in updated["metadata"].items() if k != "resourceVersion"}}
    assert http.put(CONFIGMAPS + "/a", {**unconditional, "data": {"x": "4"}})[0] == 200


def test_noop_update_keeps_resource_version(http):
    obj = http.ok("post", CONFIGMAPS, configmap("a", x="1"))
    again = http.ok("put", CONFIGMAPS + "/a", obj)
    assert again["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]


def test_generation_bumps_only_on_spec_changes(http):
    dep = http.ok("post", DEPLOYMENTS, manifest("deployment.yaml"))
    labelled = http.ok("patch", DEPLOYMENTS + "/web", {"metadata": {"labels": {"x": "y"}}})
    assert labelled["metadata"]["generation"] == 1
    scaled = http.ok("patch", DEPLOYMENTS + "/web", {"spec": {"replicas": 5}})
    assert scaled["metadata"]["generation"] == 2 and dep["metadata"]["uid"] == scaled["metadata"]["uid"]


def test_list_pagination_with_limit_and_continue(http):
    for i in range(5):
        http.ok("post", CONFIGMAPS, configmap(f"c{i}"))
    first = http.ok("get", CONFIGMAPS, limit=2)
    assert [o["metadata"]["name"] for o in first["items"]] == ["c0", "c1"]
    assert first["metadata"]["remainingItemCount"] == 3
    rest = http.ok("get", CONFIGMAPS, limit=10, **{"continue": first["metadata"]["continue"]})
    assert [o["metadata"]["name"] for o in rest["items"]] == ["c2", "c3", "c4"]


def test_cluster_wide_list_and_dry_run(http):
    http.ok("post", "/api/v1/namespaces", {"metadata": {"name": "team"}})
    http.ok("post", "/api/v1/namespaces/team/configmaps", configmap("a"))
    http.ok("post", CONFIGMAPS, configmap("a"))
    assert len(http.ok("get", "/api/v1/configmaps")["items"]) == 2
    http.ok("post", CONFIGMAPS, configmap("dry"), dryRun="All")
    assert http.get(CONFIGMAPS + "/dry")[0] == 404
