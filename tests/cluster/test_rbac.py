"""RBAC without HTTP (cluster/apiserver/rbac.py): how a URL reads as a request, how rules and bindings
decide, and the real server's 403 wording."""
from __future__ import annotations

import pytest

from specfleet.cluster.apiserver.rbac import (Policy, RequestInfo, User, authorize, bootstrap_policy, forbidden,
                                              request_info)

BOT = User("system:serviceaccount:apps:bot", ("system:serviceaccounts", "system:serviceaccounts:apps",
                                              "system:authenticated"))


def role(name: str, *rules: dict, namespace: str | None = None) -> dict:
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"kind": "Role" if namespace else "ClusterRole", "metadata": meta, "rules": list(rules)}


def binding(name: str, role_kind: str, role_name: str, *subjects: dict, namespace: str | None = None) -> dict:
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"metadata": meta, "roleRef": {"kind": role_kind, "name": role_name}, "subjects": list(subjects)}


SA = {"kind": "ServiceAccount", "name": "bot", "namespace": "apps"}


def policy(roles=(), cluster_roles=(), bindings=(), cluster_bindings=()) -> Policy:
    return Policy.build(roles, cluster_roles, bindings, cluster_bindings)


def can(p: Policy, user: User, method: str, path: str, **query: str) -> bool:
    return authorize(p, user, request_info(method, path, query)).allowed


@pytest.mark.parametrize("method, path, query, expected", [
    ("GET", "/api/v1/namespaces/a/pods/p", {}, ("get", "", "pods", "", "a", "p")),
    ("GET", "/api/v1/namespaces/a/pods", {}, ("list", "", "pods", "", "a", "")),
    ("GET", "/api/v1/namespaces/a/pods", {"watch": "true"}, ("watch", "", "pods", "", "a", "")),
    ("GET", "/api/v1/watch/namespaces/a/pods", {}, ("watch", "", "pods", "", "a", "")),
    ("GET", "/api/v1/namespaces/a/secrets", {"fieldSelector": "metadata.name=k"},
     ("list", "", "secrets", "", "a", "k")),
    ("POST", "/apis/apps/v1/namespaces/a/deployments", {}, ("create", "apps", "deployments", "", "a", "")),
    ("PUT", "/apis/apps/v1/namespaces/a/deployments/d/scale", {}, ("update", "apps", "deployments", "scale", "a", "d")),
    ("PATCH", "/apis/specfleet.io/v1alpha1/namespaces/a/inferenceservices/s/status", {},
     ("patch", "specfleet.io", "inferenceservices", "status", "a", "s")),
    ("DELETE", "/api/v1/namespaces/a/configmaps/c", {}, ("delete", "", "configmaps", "", "a", "c")),
    ("DELETE", "/api/v1/namespaces/a/configmaps", {}, ("deletecollection", "", "configmaps", "", "a", "")),
    ("POST", "/api/v1/namespaces/a/serviceaccounts/bot/token", {},
     ("create", "", "serviceaccounts", "token", "a", "bot")),
    ("GET", "/api/v1/namespaces/a", {}, ("get", "", "namespaces", "", "a", "a")),
    ("PUT", "/api/v1/namespaces/a/finalize", {}, ("update", "", "namespaces", "finalize", "a", "a")),
    ("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", {},
     ("list", "apiextensions.k8s.io", "customresourcedefinitions", "", "", "")),
])
def test_a_url_reads_as_the_verb_and_resource_kube_apiserver_authorizes(method, path, query, expected):
    info = request_info(method, path, query)
    assert info.resource_request
    assert (info.verb, info.group, info.resource, info.subresource, info.namespace, info.name) == expected


@pytest.mark.parametrize("path", ["/api", "/apis", "/apis/apps/v1", "/api/v1", "/healthz", "/openapi/v3/apis/apps/v1"])
def test_discovery_and_health_are_non_resource_paths(path):
    info = request_info("GET", path)
    assert (info.resource_request, info.verb, info.path) == (False, "get", path)


def test_a_cluster_role_binding_grants_its_verbs_everywhere_and_nothing_else():
    rule = {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list"]}
    p = policy(cluster_roles=[role("r", rule)],
               cluster_bindings=[binding("b", "ClusterRole", "r", SA)])
    assert can(p, BOT, "GET", "/apis/apps/v1/namespaces/x/deployments/d")
    assert can(p, BOT, "GET", "/apis/apps/v1/deployments")
    assert not can(p, BOT, "PATCH", "/apis/apps/v1/namespaces/x/deployments/d")
    assert not can(p, BOT, "GET", "/api/v1/namespaces/x/pods")                  # other group and resource
    assert not can(p, User("someone", ("system:authenticated",)), "GET", "/apis/apps/v1/namespaces/x/deployments/d")


def test_a_role_binding_to_a_cluster_role_grants_only_in_its_namespace():
    p = policy(cluster_roles=[role("view", {"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]})],
               bindings=[binding("b", "ClusterRole", "view", SA, namespace="apps")])
    assert can(p, BOT, "GET", "/api/v1/namespaces/apps/pods")
    assert not can(p, BOT, "GET", "/api/v1/namespaces/other/pods")
    assert not can(p, BOT, "GET", "/api/v1/pods")                                # all namespaces: cluster scope


def test_a_service_account_subject_without_namespace_means_the_binding_s_namespace():
    p = policy(roles=[role("r", {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}, namespace="apps")],
               bindings=[binding("b", "Role", "r", {"kind": "ServiceAccount", "name": "bot"}, namespace="apps")])
    assert can(p, BOT, "GET", "/api/v1/namespaces/apps/pods/p")


def test_groups_and_users_are_subjects():
    r = role("r", {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]})
    group = {"kind": "Group", "name": "system:serviceaccounts"}
    by_group = policy(cluster_roles=[r], cluster_bindings=[binding("b", "ClusterRole", "r", group)])
    by_user = policy(cluster_roles=[r], cluster_bindings=[binding("b", "ClusterRole", "r",
                                                                  {"kind": "User", "name": "alice"})])
    assert can(by_group, BOT, "GET", "/api/v1/namespaces/a/configmaps/c")
    assert can(by_user, User("alice"), "GET", "/api/v1/namespaces/a/configmaps/c")
    assert not can(by_user, BOT, "GET", "/api/v1/namespaces/a/configmaps/c")


def test_resource_names_limit_gets_and_name_pinned_lists_but_not_plain_lists():
    p = policy(roles=[role("r", {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["keys"],
                                 "verbs": ["get", "list", "watch"]}, namespace="apps")],
               bindings=[binding("b", "Role", "r", SA, namespace="apps")])
    assert can(p, BOT, "GET", "/api/v1/namespaces/apps/secrets/keys")
    assert not can(p, BOT, "GET", "/api/v1/namespaces/apps/secrets/other")
    assert can(p, BOT, "GET", "/api/v1/namespaces/apps/secrets", watch="true", fieldSelector="metadata.name=keys")
    assert not can(p, BOT, "GET", "/api/v1/namespaces/apps/secrets")


def test_subresources_need_their_own_rule_or_a_star_subresource():
    main_only = policy(cluster_roles=[role("r", {"apiGroups": ["*"], "resources": ["deployments"], "verbs": ["*"]})],
                       cluster_bindings=[binding("b", "ClusterRole", "r", SA)])
    assert can(main_only, BOT, "PATCH", "/apis/apps/v1/namespaces/a/deployments/d")
    assert not can(main_only, BOT, "PATCH", "/apis/apps/v1/namespaces/a/deployments/d/scale")
    star = policy(cluster_roles=[role("r", {"apiGroups": ["apps"], "resources": ["*/scale"], "verbs": ["patch"]})],
                  cluster_bindings=[binding("b", "ClusterRole", "r", SA)])
    assert can(star, BOT, "PATCH", "/apis/apps/v1/namespaces/a/deployments/d/scale")
    assert not can(star, BOT, "PATCH", "/apis/apps/v1/namespaces/a/deployments/d")


def test_non_resource_urls_match_exactly_or_by_a_trailing_star():
    p = policy(cluster_roles=[role("r", {"nonResourceURLs": ["/metrics", "/logs/*"], "verbs": ["get"]})],
               cluster_bindings=[binding("b", "ClusterRole", "r", SA)])
    assert can(p, BOT, "GET", "/metrics")
    assert can(p, BOT, "GET", "/logs/a/b")
    assert not can(p, BOT, "GET", "/metricsx")
    assert not can(p, BOT, "POST", "/metrics")


def test_system_masters_may_do_anything_and_the_defaults_grant_discovery_to_authenticated_users():
    p = policy(cluster_roles=[o for k, o in bootstrap_policy() if o["kind"] == "ClusterRole"],
               cluster_bindings=[o for k, o in bootstrap_policy() if o["kind"] == "ClusterRoleBinding"])
    assert can(p, User("x", ("system:masters",)), "DELETE", "/api/v1/namespaces/a/pods")
    for path in ("/api", "/apis/apps/v1", "/version", "/openapi/v3"):
        assert can(p, BOT, "GET", path)
    assert can(p, BOT, "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews")
    anonymous = User("system:anonymous", ("system:unauthenticated",))
    assert can(p, anonymous, "GET", "/healthz") and can(p, anonymous, "GET", "/version")
    assert not can(p, anonymous, "GET", "/api")
    assert not can(p, BOT, "GET", "/api/v1/namespaces/a/pods")


def test_a_binding_to_a_missing_role_is_the_denial_s_reason():
    p = policy(cluster_bindings=[binding("b", "ClusterRole", "gone", SA)])
    decision = authorize(p, BOT, request_info("GET", "/api/v1/namespaces/a/pods"))
    assert not decision.allowed
    assert decision.reason == 'RBAC: clusterrole.rbac.authorization.k8s.io "gone" not found'


def test_forbidden_is_worded_as_kube_apiserver_words_it():
    op = User("system:serviceaccount:specfleet-system:specfleet-operator")
    named = forbidden(op, request_info("PATCH", "/apis/apps/v1/namespaces/default/deployments/x"))
    assert named.status() == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Forbidden", "code": 403,
        "message": 'deployments.apps "x" is forbidden: User '
                   '"system:serviceaccount:specfleet-system:specfleet-operator" cannot patch resource "deployments" '
                   'in API group "apps" in the namespace "default"',
        "details": {"name": "x", "group": "apps", "kind": "deployments"}}
    listing = forbidden(op, request_info("GET", "/api/v1/pods"))
    assert listing.message == ('pods is forbidden: User "system:serviceaccount:specfleet-system:specfleet-operator" '
                               'cannot list resource "pods" in API group "" at the cluster scope')
    assert listing.details == {"kind": "pods"}
    status = forbidden(op, request_info("PATCH", "/apis/specfleet.io/v1alpha1/namespaces/d/inferenceservices/s/status"))
    assert 'cannot patch resource "inferenceservices/status" in API group "specfleet.io"' in status.message
    assert status.message.startswith('inferenceservices.specfleet.io "s" is forbidden')
    path = forbidden(User("system:anonymous"), RequestInfo("get", False, path="/api"))
    assert path.status()["details"] == {}
    assert path.message == 'forbidden: User "system:anonymous" cannot get path "/api"'
