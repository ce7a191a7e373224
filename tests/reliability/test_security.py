"""Security: the admin token (constant-time compare, from a mounted Secret), hardened engine pods, the
admin NetworkPolicy, least-privilege RBAC (every verb has a reason), and no token in status or logs."""
from __future__ import annotations

import inspect
from pathlib import Path

import httpx
import pytest
import yaml

from specfleet.operator import api, catalogs, planner, render
from specfleet.operator.reconcile import reconcile

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "fuzz-admin-token"
CPU_SPEC = yaml.safe_load((ROOT / "manifests/examples/smollm2-cpu.yaml").read_text())["spec"]

# Why the operator holds each verb; a verb in manifests/rbac*.yaml without a line here fails the test.
RBAC_REASONS = {
    ("apiextensions.k8s.io", "customresourcedefinitions", "get"): "kopf checks the CRD exists",
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"): "kopf discovers served resources",
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"): "kopf follows CRD changes",
    ("specfleet.io", "inferenceservices", "get"): "control loop and owned_changed read the CR",
    ("specfleet.io", "inferenceservices", "list"): "kopf lists CRs on start",
    ("specfleet.io", "inferenceservices", "watch"): "kopf watches CRs",
    ("specfleet.io", "inferenceservices", "patch"): "kopf stores progress/diff-base annotations and finalizer",
    ("specfleet.io", "inferenceservices/status", "get"): "status subresource reads",
    ("specfleet.io", "inferenceservices/status", "patch"): "status: plan, observed, decisions",
    ("specfleet.io", "inferenceservices/status", "update"): "kopf's status writes on older servers",
    ("apps", "deployments", "get"): "Kube.get before apply; replicas for status",
    ("apps", "deployments", "list"): "kopf watch of owned Deployments (initial list)",
    ("apps", "deployments", "watch"): "drift correction on owned Deployments",
    ("apps", "deployments", "create"): "render -> apply",
    ("apps", "deployments", "patch"): "drift correction and scaling",
    ("", "services", "get"): "Kube.get before apply",
    ("", "services", "list"): "kopf watch (initial list)",
    ("", "services", "watch"): "drift correction",
    ("", "services", "create"): "render -> apply",
    ("", "services", "patch"): "drift correction",
    ("policy", "poddisruptionbudgets", "get"): "Kube.get before apply",
    ("policy", "poddisruptionbudgets", "list"): "kopf watch (initial list)",
    ("policy", "poddisruptionbudgets", "watch"): "drift correction",
    ("policy", "poddisruptionbudgets", "create"): "render -> apply",
    ("policy", "poddisruptionbudgets", "patch"): "drift correction",
    ("networking.k8s.io", "networkpolicies", "get"): "Kube.get before apply",
    ("networking.k8s.io", "networkpolicies", "create"): "engine ingress: operator and labelled clients only",
    ("networking.k8s.io", "networkpolicies", "patch"): "drift correction",
    ("", "secrets", "get"): "create_if_missing; the control loop reads the admin token",
    ("", "secrets", "create"): "the admin token Secret, once per InferenceService",
    ("", "events", "create"): "an Event for every decision",
    ("", "events", "patch"): "kopf aggregates repeated Events",
    ("events.k8s.io", "events", "create"): "an Event for every decision (new API)",
    ("events.k8s.io", "events", "patch"): "kopf aggregates repeated Events (new API)",
    ("", "pods", "get"): "control loop: pod endpoints to scrape",
    ("", "pods", "list"): "control loop: ready pods of a Service",
    ("", "pods", "watch"): "kopf-compatible pod lookups",
    ("", "pods", "patch"): "scale-down: controller.kubernetes.io/pod-deletion-cost on the pods chosen to go",
    ("", "namespaces", "list"): "with --namespace, kopf follows the named namespaces (read only)",
    ("", "namespaces", "watch"): "with --namespace, kopf follows the named namespaces (read only)",
    ("coordination.k8s.io", "leases", "create"): "leader election: the Lease, the first time (Role, one namespace)",
    ("coordination.k8s.io", "leases", "get"): "leader election: read the Lease (its name only)",
    ("coordination.k8s.io", "leases", "update"): "leader election: acquire, renew, release (its name only)",
}
NEVER = {"delete", "deletecollection", "escalate", "bind", "impersonate", "*"}


def _cluster_role_rules() -> list[dict]:
    rules = []
    for path in sorted((ROOT / "manifests").glob("rbac*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") in ("ClusterRole", "Role"):
                rules += doc.get("rules") or []
    return rules


def test_every_rbac_verb_has_a_reason_and_none_is_dangerous():
    held = {(group, resource, verb) for rule in _cluster_role_rules() for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}
    assert held, "no ClusterRole found in manifests/rbac*.yaml"
    unexplained = sorted(held - set(RBAC_REASONS))
    assert unexplained == [], f"verbs without a reason: {unexplained}"
    assert not {verb for _, _, verb in held} & NEVER
    assert not any("*" in (group, resource) for group, resource, _ in held)
    print(f"RBAC: {len(held)} verbs held, each with a reason")


def test_the_admin_token_is_compared_in_constant_time():
    from specfleet.engine.server import auth

    assert "matches(given, (access.admin_token,))" in inspect.getsource(auth.require_admin)
    source = inspect.getsource(auth.matches)
    assert "hmac.compare_digest" in source and "==" not in source


def test_the_admin_api_refuses_missing_and_wrong_tokens(abuse_server):
    url = abuse_server.base_url + "/admin/speculation"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(url, headers={"Authorization": f"Basic {TOKEN}"}).status_code == 401
    assert httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_a_served_engine_takes_keys_from_flag_file_and_environment_and_keeps_admin_off(
        engine_process, rel, tmp_path, monkeypatch):
    """`specfleet engine serve` as deployed: keys from --api-key, --api-key-file and SPECFLEET_API_KEY; no
    --admin-token-file, so the admin API is off; probes and metrics stay open."""
    keys = tmp_path / "api-keys"
    keys.write_text("file-key\n")
    monkeypatch.setenv("SPECFLEET_API_KEY", "env-key")
    server = engine_process("--max-model-len", "64", "--api-key", "flag-key", "--api-key-file", str(keys))
    assert rel.wait_for(server.ready, 90, 0.2)
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
    for key in ("flag-key", "file-key", "env-key"):
        ok = httpx.post(server.url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"},
                        timeout=60)
        assert ok.status_code == 200, (key, ok.text)
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        refused = httpx.post(server.url + "/v1/completions", json=body, headers=headers, timeout=60)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    for path in ("/health", "/ready", "/metrics"):
        assert httpx.get(server.url + path).status_code == 200
    admin = httpx.post(server.url + "/admin/speculation", json={"enabled": True},
                       headers={"Authorization": "Bearer flag-key"})
    assert admin.status_code == 403 and admin.json()["error"]["code"] == "admin_api_disabled"


@pytest.fixture(scope="module")
def rendered():
    spec = api.parse_spec(CPU_SPEC)
    plan = planner.plan(spec, catalogs.gpus(), catalogs.models())
    assert not isinstance(plan, planner.Infeasible), plan
    return render.render("svc", "ns", spec, plan)


def test_engine_pods_run_non_root_read_only_without_a_service_account_token(rendered):
    pod = rendered[0]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    for container in pod["containers"] + pod.get("initContainers", []):
        ctx = container["securityContext"]
        assert ctx["readOnlyRootFilesystem"] is True and ctx["allowPrivilegeEscalation"] is False
        assert ctx["capabilities"]["drop"] == ["ALL"]


def test_the_admin_token_comes_from_a_mounted_secret(rendered):
    pod = rendered[0]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    args = container["args"]
    assert args[args.index("--admin-token-file") + 1] == render.ADMIN_TOKEN_FILE
    volume = next(v for v in pod["volumes"] if v["name"] == "admin-token")
    assert volume["secret"]["secretName"] == render.admin_secret_name("svc")
    mount = next(m for m in container["volumeMounts"] if m["name"] == "admin-token")
    assert mount["readOnly"] is True and render.ADMIN_TOKEN_FILE.startswith(mount["mountPath"])
    assert not any(TOKEN in str(e) or "token" == e.get("name", "").lower() for e in container["env"])


def test_the_network_policy_admits_only_the_operator_and_labelled_clients():
    policy = render.network_policy("svc", "ns")
    assert policy["spec"]["podSelector"]["matchLabels"] == render.selector("svc")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    peers = [peer for rule in policy["spec"]["ingress"] for peer in rule["from"]]
    assert all(peer.get("podSelector", {}).get("matchLabels") for peer in peers)   # never "everyone"
    operator = policy["spec"]["ingress"][0]["from"][0]
    assert operator["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "specfleet-operator"}
    manifests = list(yaml.safe_load_all((ROOT / "manifests/operator.yaml").read_text()))
    deployment = next(d for d in manifests if d and d.get("kind") == "Deployment")
    assert deployment["metadata"]["namespace"] == render.OPERATOR_NAMESPACE
    assert operator["podSelector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def test_the_token_never_reaches_status_events_or_logs(caplog):
    from specfleet.operator.kube import is_subset

    class FakeKube:
        def __init__(self):
            self.objects = {}

        def get(self, kind, namespace, name):
            return self.objects.get((kind, namespace, name))

        def apply(self, manifest, live=None):      # `live` (the caller's read) saves Kube a GET; none here
            key = (manifest["kind"], manifest["metadata"]["namespace"], manifest["metadata"]["name"])
            live = self.objects.get(key)
            if live is not None and is_subset(manifest, live):
                return "unchanged"
            self.objects[key] = manifest
            return "created" if live is None else "updated"

        def create_if_missing(self, manifest, live=None):
            return self.objects.setdefault((manifest["kind"], "ns", manifest["metadata"]["name"]), manifest) is manifest

    kube = FakeKube()
    body = {"metadata": {"name": "svc", "namespace": "ns", "uid": "u1", "generation": 1}, "spec": CPU_SPEC}
    with caplog.at_level("DEBUG"):
        outcome = reconcile(body, kube, "2026-01-01T00:00:00Z")
    token = kube.objects[("Secret", "ns", "svc-admin")]["stringData"]["token"]
    assert len(token) >= 32
    everything = repr(outcome.status) + repr(outcome.events) + caplog.text
    everything += repr(kube.objects[("Deployment", "ns", "svc")])
    assert token not in everything
