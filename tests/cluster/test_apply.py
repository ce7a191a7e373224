"""Server-side apply: create via apply, managedFields per manager, conflicts (409) and force."""
import json

from tests.cluster.conftest import DEPLOYMENTS, WIDGETS, manifest, widget


def managers(obj):
    return {(e["manager"], e["operation"]) for e in obj["metadata"]["managedFields"]}


def test_apply_creates_then_updates_and_records_the_manager(http):
    dep = manifest("deployment.yaml")
    code, out = http.patch(DEPLOYMENTS + "/web", json.dumps(dep), kind="apply", fieldManager="argocd")
    assert code == 201 and ("argocd", "Apply") in managers(out)
    fields = next(e for e in out["metadata"]["managedFields"] if e["manager"] == "argocd")["fieldsV1"]
    containers = fields["f:spec"]["f:template"]["f:spec"]["f:containers"]
    assert 'k:{"name":"app"}' in containers and "." in containers['k:{"name":"app"}']
    dep["spec"]["replicas"] = 4
    out = http.ok("patch", DEPLOYMENTS + "/web", json.dumps(dep), kind="apply", fieldManager="argocd")
    assert out["spec"]["replicas"] == 4 and out["metadata"]["generation"] == 2


def test_apply_conflicts_with_another_manager_unless_forced(http):
    dep = manifest("deployment.yaml")
    http.ok("patch", DEPLOYMENTS + "/web", json.dumps(dep), kind="apply", fieldManager="argocd")
    http.ok("patch", DEPLOYMENTS + "/web", {"spec": {"replicas": 9}}, fieldManager="hpa")
    dep["spec"]["template"]["spec"]["containers"][0]["image"] = "nginx:2"
    code, body = http.patch(DEPLOYMENTS + "/web", json.dumps(dep), kind="apply", fieldManager="argocd")
    assert code == 409 and body["details"]["causes"][0]["field"] == ".spec.replicas"
    assert 'conflict with "hpa"' in body["message"]
    out = http.ok("patch", DEPLOYMENTS + "/web", json.dumps(dep), kind="apply", fieldManager="argocd", force="true")
    assert out["spec"]["replicas"] == 2
    hpa = [e for e in out["metadata"]["managedFields"] if e["manager"] == "hpa"]
    assert not hpa or "f:replicas" not in hpa[0]["fieldsV1"].get("f:spec", {})


def test_apply_removes_fields_the_manager_stopped_applying(http):
    dep = manifest("deployment.yaml")
    http.ok("patch", DEPLOYMENTS + "/web", json.dumps(dep), kind="apply", fieldManager="flux")
    del dep["spec"]["template"]["spec"]["containers"][1]
    dep["metadata"]["labels"] = {}
    out = http.ok("patch", DEPLOYMENTS + "/web", json.dumps(dep), kind="apply", fieldManager="flux")
    assert [c["name"] for c in out["spec"]["template"]["spec"]["containers"]] == ["app"]
    assert "app" not in (out["metadata"].get("labels") or {})


def test_shared_ownership_when_values_agree(http):
    dep = manifest("deployment.yaml")
    http.ok("patch", DEPLOYMENTS + "/web", json.dumps(dep), kind="apply", fieldManager="a")
    out = http.ok("patch", DEPLOYMENTS + "/web", json.dumps(dep), kind="apply", fieldManager="b")
    assert {("a", "Apply"), ("b", "Apply")} <= managers(out)


def test_apply_to_custom_resource_with_map_list(http, crd):
    w = widget(ports=[{"name": "http", "port": 80}])
    http.ok("patch", WIDGETS + "/w1", json.dumps(w), kind="apply", fieldManager="a")
    b = {**widget(), "spec": {"size": "small", "ports": [{"name": "grpc", "port": 90}]}}
    out = http.ok("patch", WIDGETS + "/w1", json.dumps(b), kind="apply", fieldManager="b")
    assert sorted(p["name"] for p in out["spec"]["ports"]) == ["grpc", "http"]


def test_apply_requires_field_manager_and_matching_kind(http):
    dep = manifest("deployment.yaml")
    code, body = http.patch(DEPLOYMENTS + "/web", json.dumps(dep), kind="apply", headers={"User-Agent": ""})
    assert code == 422 and body["message"] == ('PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
                                               "is required for apply patch")
    dep["kind"] = "ReplicaSet"
    assert http.patch(DEPLOYMENTS + "/web", json.dumps(dep), kind="apply", fieldManager="x")[0] == 400
