"""Authentication and RBAC over the wire: the admin kubeconfig, ServiceAccount tokens from `kubectl create
token`, 401 and 403 bodies as kube-apiserver sends them, and RBAC objects taking effect as they change.
Clients: the real kubectl and the official `kubernetes` client, on the emulator's HTTPS port."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from specfleet.cluster.apiserver import running_apiserver

BIN = Path(sys.executable).parent
NS = "apps"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
UNAUTHORIZED = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": "Unauthorized",
                "reason": "Unauthorized", "code": 401}
BOT = f"system:serviceaccount:{NS}:bot"


@pytest.fixture
def server(tmp_path):
    with running_apiserver(tmp_path / "kubeconfig") as api:
        if api.secure_url is None:
            pytest.skip("no openssl: the emulator has no HTTPS port, and kubectl sends tokens only over HTTPS")
        yield api


class Client:
    """requests against the HTTPS port with one bearer token (or none)."""

    def __init__(self, server, token: str | None):
        self.url, self.ca = server.secure_url, str(server.certificate.cert)
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def call(self, method: str, path: str, body=None, **params) -> requests.Response:
        ctype = "application/merge-patch+json" if method == "PATCH" else "application/json"
        return requests.request(method, self.url + path, json=body, params=params or None, verify=self.ca,
                                headers={**self.headers, "Content-Type": ctype}, timeout=10)


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "kubectl"), "--kubeconfig", str(kubeconfig), "--cache-dir",
                           str(kubeconfig.parent / "cache"), *args], input=stdin, capture_output=True, text=True,
                          timeout=30, env={**os.environ, "HOME": str(kubeconfig.parent)})


def admin(server) -> Client:
    from specfleet.cluster.apiserver.kubeconfig import TOKEN
    return Client(server, TOKEN)


def setup_bot(server, *rules: dict, cluster: bool = False) -> None:
    """Namespace `apps`, ServiceAccount `bot`, and a Role (or ClusterRole) with `rules` bound to it there."""
    a = admin(server)
    a.call("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
    assert a.call("POST", f"/api/v1/namespaces/{NS}/serviceaccounts", {"metadata": {"name": "bot"}}).ok
    kind = "ClusterRole" if cluster else "Role"
    base = f"{RBAC}/clusterroles" if cluster else f"{RBAC}/namespaces/{NS}/roles"
    assert a.call("POST", base, {"kind": kind, "metadata": {"name": "bot"}, "rules": list(rules)}).ok
    assert a.call("POST", f"{RBAC}/namespaces/{NS}/rolebindings", {
        "metadata": {"name": "bot"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": "bot"},
        "subjects": [{"kind": "ServiceAccount", "name": "bot", "namespace": NS}]}).ok


def bot(server) -> Client:
    return Client(server, server.issue_token(NS, "bot"))


def test_the_admin_kubeconfig_may_do_anything_and_is_system_admin(server, tmp_path):
    kubeconfig = Path(server.kubeconfig)
    assert "https://" in kubeconfig.read_text() and "certificate-authority-data" in kubeconfig.read_text()
    who = kubectl(kubeconfig, "auth", "whoami")
    assert "system:admin" in who.stdout and "system:masters" in who.stdout
    created = kubectl(kubeconfig, "create", "namespace", "x")          # protobuf: refused by the decoder, not RBAC
    assert "forbidden" not in created.stderr
    assert kubectl(kubeconfig, "apply", "-f", "-", stdin="apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n"
                   ).returncode == 0
    assert kubectl(kubeconfig, "delete", "configmap", "c").returncode == 0
    assert list(server.authorizer.denials) == []


def test_a_token_from_kubectl_create_token_works_and_is_limited_by_its_role(server, tmp_path):
    from kubernetes import client, config

    setup_bot(server, {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]})
    made = kubectl(Path(server.kubeconfig), "create", "token", "bot", "-n", NS, "--duration", "20m")
    assert made.returncode == 0, made.stderr
    kubeconfig = server.write_kubeconfig(tmp_path / "bot" / "kubeconfig", token=made.stdout.strip(), user="bot",
                                         namespace=NS)
    who = kubectl(kubeconfig, "auth", "whoami")
    assert BOT in who.stdout and f"system:serviceaccounts:{NS}" in who.stdout
    assert kubectl(kubeconfig, "get", "configmaps").returncode == 0
    assert kubectl(kubeconfig, "auth", "can-i", "list", "configmaps").stdout.strip() == "yes"
    assert kubectl(kubeconfig, "auth", "can-i", "create", "configmaps").stdout.strip() == "no"
    refused = kubectl(kubeconfig, "get", "pods")
    assert (f'Error from server (Forbidden): pods is forbidden: User "{BOT}" cannot list resource "pods" in API group '
            f'"" in the namespace "{NS}"') in refused.stderr

    core = client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))
    assert core.list_namespaced_config_map(NS).items == []
    with pytest.raises(client.ApiException) as denied:
        core.create_namespaced_config_map(NS, {"metadata": {"name": "c"}})
    assert denied.value.status == 403
    with pytest.raises(client.ApiException) as elsewhere:
        core.list_namespaced_config_map("default")
    assert elsewhere.value.status == 403
    assert [(d.user, d.verb, d.resource, d.namespace) for d in server.authorizer.denied(user=BOT)] == [
        (BOT, "list", "pods", NS), (BOT, "create", "configmaps", NS), (BOT, "list", "configmaps", "default")]


def test_token_requests_are_201_with_a_token_404_without_the_account_and_422_when_too_short(server):
    setup_bot(server)
    a = admin(server)
    path = f"/api/v1/namespaces/{NS}/serviceaccounts/bot/token"
    issued = a.call("POST", path, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                   "spec": {"expirationSeconds": 3600}})
    assert issued.status_code == 201
    body = issued.json()
    assert body["kind"] == "TokenRequest" and body["status"]["token"] and body["status"]["expirationTimestamp"]
    missing = a.call("POST", f"/api/v1/namespaces/{NS}/serviceaccounts/nobody/token", {})
    assert (missing.status_code, missing.json()["message"]) == (404, 'serviceaccounts "nobody" not found')
    short = a.call("POST", path, {"spec": {"expirationSeconds": 60}})
    assert short.status_code == 422
    assert short.json()["message"] == ('TokenRequest.authentication.k8s.io "bot" is invalid: spec.expirationSeconds: '
                                       'Invalid value: 60: may not specify a duration less than 10 minutes')
    assert Client(server, body["status"]["token"]).call("GET", "/api").status_code == 200


def test_unknown_expired_and_orphaned_tokens_are_401_with_the_real_body(server):
    setup_bot(server, {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]})
    path = f"/api/v1/namespaces/{NS}/configmaps"
    unknown = Client(server, "not-a-token").call("GET", path)
    assert (unknown.status_code, unknown.json()) == (401, UNAUTHORIZED)

    b = bot(server)
    assert b.call("GET", path).status_code == 200
    real_clock = server.tokens.clock
    server.tokens.clock = lambda: real_clock() + 3601
    assert b.call("GET", path).json() == UNAUTHORIZED
    server.tokens.clock = real_clock

    assert admin(server).call("DELETE", f"/api/v1/namespaces/{NS}/serviceaccounts/bot").ok
    assert b.call("GET", path).json() == UNAUTHORIZED
    assert admin(server).call("POST", f"/api/v1/namespaces/{NS}/serviceaccounts", {"metadata": {"name": "bot"}}).ok
    assert b.call("GET", path).status_code == 401          # a new account of the same name: a new uid


def test_forbidden_is_403_with_the_real_body_and_recorded(server):
    setup_bot(server, {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get"]})
    refused = bot(server).call("PATCH", f"/apis/apps/v1/namespaces/{NS}/deployments/x", {"spec": {}})
    assert refused.status_code == 403
    assert refused.json() == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Forbidden", "code": 403,
        "message": f'deployments.apps "x" is forbidden: User "{BOT}" cannot patch resource "deployments" in API '
                   f'group "apps" in the namespace "{NS}"',
        "details": {"name": "x", "group": "apps", "kind": "deployments"}}
    cluster_scope = bot(server).call("GET", "/api/v1/nodes")
    assert cluster_scope.json()["message"] == (f'nodes is forbidden: User "{BOT}" cannot list resource "nodes" in API '
                                               'group "" at the cluster scope')
    [patch, nodes] = server.authorizer.denied(user=BOT)
    assert (patch.verb, patch.group, patch.resource, patch.namespace, patch.name) == ("patch", "apps", "deployments",
                                                                                      NS, "x")
    assert (nodes.verb, nodes.resource, nodes.namespace) == ("list", "nodes", "")


def test_resource_names_allow_only_the_named_object(server):
    setup_bot(server, {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["keys"],
                       "verbs": ["get", "list", "watch"]})
    a = admin(server)
    for name in ("keys", "other"):
        a.call("POST", f"/api/v1/namespaces/{NS}/secrets", {"metadata": {"name": name}})
    b = bot(server)
    assert b.call("GET", f"/api/v1/namespaces/{NS}/secrets/keys").status_code == 200
    assert b.call("GET", f"/api/v1/namespaces/{NS}/secrets/other").status_code == 403
    assert b.call("GET", f"/api/v1/namespaces/{NS}/secrets").status_code == 403
    pinned = b.call("GET", f"/api/v1/namespaces/{NS}/secrets", fieldSelector="metadata.name=keys")
    assert [s["metadata"]["name"] for s in pinned.json()["items"]] == ["keys"]


def test_subresources_are_authorized_on_their_own(server):
    setup_bot(server, {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "patch"]})
    deployment = {"metadata": {"name": "d"}, "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {
        "metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}}
    assert admin(server).call("POST", f"/apis/apps/v1/namespaces/{NS}/deployments", deployment).ok
    b = bot(server)
    assert b.call("PATCH", f"/apis/apps/v1/namespaces/{NS}/deployments/d", {"spec": {"replicas": 2}}).ok
    scale = b.call("PATCH", f"/apis/apps/v1/namespaces/{NS}/deployments/d/scale", {"spec": {"replicas": 3}})
    assert scale.status_code == 403
    assert 'cannot patch resource "deployments/scale" in API group "apps"' in scale.json()["message"]
    assert b.call("GET", f"/apis/apps/v1/namespaces/{NS}/deployments/d/status").status_code == 403


def test_a_role_binding_to_a_cluster_role_is_limited_to_its_namespace(server):
    setup_bot(server, {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}, cluster=True)
    b = bot(server)
    assert b.call("GET", f"/api/v1/namespaces/{NS}/configmaps").status_code == 200
    assert b.call("GET", "/api/v1/namespaces/default/configmaps").status_code == 403
    assert b.call("GET", "/api/v1/configmaps").status_code == 403


def test_deleting_the_binding_revokes_access_and_recreating_it_restores_it(server):
    setup_bot(server, {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]})
    b, a = bot(server), admin(server)
    path = f"/api/v1/namespaces/{NS}/configmaps"
    assert b.call("GET", path).status_code == 200
    binding = a.call("GET", f"{RBAC}/namespaces/{NS}/rolebindings/bot").json()
    assert a.call("DELETE", f"{RBAC}/namespaces/{NS}/rolebindings/bot").ok
    assert b.call("GET", path).status_code == 403
    binding["metadata"] = {"name": "bot"}
    assert a.call("POST", f"{RBAC}/namespaces/{NS}/rolebindings", binding).ok
    assert b.call("GET", path).status_code == 200
    assert a.call("PATCH", f"{RBAC}/namespaces/{NS}/roles/bot", {"rules": [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}]}).ok          # the role changed
    assert b.call("GET", path).status_code == 403


def test_watch_is_its_own_verb(server):
    setup_bot(server, {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]})
    b = bot(server)
    path = f"/api/v1/namespaces/{NS}/configmaps"
    refused = b.call("GET", path, watch="true", timeoutSeconds="1")
    assert refused.status_code == 403
    assert 'cannot watch resource "configmaps"' in refused.json()["message"]
    assert admin(server).call("PATCH", f"{RBAC}/namespaces/{NS}/roles/bot", {"rules": [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"]}]}).ok
    assert b.call("GET", path, watch="true", timeoutSeconds="1").status_code == 200


def test_anonymous_requests_see_health_only_on_https_and_act_as_admin_on_the_local_http_port(server, tmp_path):
    anonymous = Client(server, None)
    assert anonymous.call("GET", "/healthz").status_code == 200
    assert anonymous.call("GET", "/version").status_code == 200
    api = anonymous.call("GET", "/api")
    assert api.status_code == 403
    assert api.json()["message"] == 'forbidden: User "system:anonymous" cannot get path "/api"'
    assert api.json()["details"] == {}
    assert requests.get(server.url + "/api/v1/namespaces", timeout=10).status_code == 200
    assert requests.get(server.url + "/api/v1/namespaces", headers={"Authorization": "Bearer nope"},
                        timeout=10).status_code == 401
    with running_apiserver(tmp_path / "strict", local_admin=False, https=False) as strict:
        assert strict.secure_url is None and "http://" in Path(strict.kubeconfig).read_text()
        assert requests.get(strict.url + "/api/v1/namespaces", timeout=10).status_code == 403
        assert requests.get(strict.url + "/healthz", timeout=10).status_code == 200


def test_impersonation_needs_the_impersonate_verb(server, tmp_path):
    setup_bot(server, {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]})
    kubeconfig = Path(server.kubeconfig)
    assert kubectl(kubeconfig, "auth", "can-i", "list", "configmaps", "-n", NS, "--as", BOT).stdout.strip() == "yes"
    assert kubectl(kubeconfig, "auth", "can-i", "list", "pods", "-n", NS, "--as", BOT).stdout.strip() == "no"
    assert bot(server).call("GET", "/api").status_code == 200
    b = bot(server)
    b.headers["Impersonate-User"] = "alice"
    refused = b.call("GET", "/api")
    assert refused.json()["message"] == (f'users "alice" is forbidden: User "{BOT}" cannot impersonate resource '
                                         '"users" in API group "" at the cluster scope')


def test_tokens_survive_a_restart_with_a_state_file(tmp_path):
    state = tmp_path / "state.json"
    with running_apiserver(tmp_path / "kc", state_file=state) as first:
        if first.secure_url is None:
            pytest.skip("no openssl")
        setup_bot(first, {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]})
        token = first.issue_token(NS, "bot")
    assert token not in state.read_text()                         # kept as a digest
    with running_apiserver(tmp_path / "kc", state_file=state) as second:
        assert Client(second, token).call("GET", f"/api/v1/namespaces/{NS}/configmaps").status_code == 200
        assert Client(second, "other").call("GET", "/api").status_code == 401


def test_authorization_stays_cheap_with_many_bindings(server):
    """The policy is indexed by subject: 2,000 unrelated bindings do not slow a request's check."""
    from specfleet.cluster.apiserver.rbac import request_info
    setup_bot(server, {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]})
    for i in range(2000):
        server.store.put("rbac.authorization.k8s.io/rolebindings", {
            "metadata": {"name": f"b{i}", "namespace": NS}, "roleRef": {"kind": "Role", "name": "bot"},
            "subjects": [{"kind": "User", "name": f"user{i}"}]})
    user = server.tokens.user(server.issue_token(NS, "bot"))
    info = request_info("GET", f"/api/v1/namespaces/{NS}/configmaps")
    server.authorizer.decide(user, info)                         # builds the index once
    start = time.perf_counter()
    for _ in range(2000):
        assert server.authorizer.decide(user, info).allowed
    assert (time.perf_counter() - start) / 2000 < 0.001


def test_an_informer_refused_by_rbac_names_the_permission_and_the_others_keep_following(server, caplog):
    """The gateway's informers (cluster/api_client.py): a 403 on one kind is logged once per retry with the
    server's message, and the kinds it may read are still followed."""
    import asyncio

    from specfleet.cluster.api_client import ApiClient, Informer

    setup_bot(server, {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"]})
    admin(server).call("POST", f"/api/v1/namespaces/{NS}/configmaps", {"metadata": {"name": "seen"}})

    async def follow() -> list[dict]:
        async with ApiClient(server.url, token=server.issue_token(NS, "bot")) as api:
            allowed = Informer(api, "ConfigMap", namespace=NS)
            refused = Informer(api, "Pod", namespace=NS)
            tasks = [asyncio.create_task(i.run(lambda: None)) for i in (allowed, refused)]
            await asyncio.sleep(1.0)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return allowed.items()

    with caplog.at_level("WARNING", logger="specfleet.api_client"):
        items = asyncio.run(follow())
    assert [i["metadata"]["name"] for i in items] == ["seen"]
    warnings = [r.getMessage() for r in caplog.records if r.name == "specfleet.api_client"]
    assert len(warnings) == 1 and warnings[0].startswith(
        f'missing RBAC permission: pods is forbidden: User "{BOT}" cannot list resource "pods"')
