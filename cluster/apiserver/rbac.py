"""RBAC, pure: a request's attributes from its method and URL, the policy that Roles, ClusterRoles and their
bindings make, whether it allows a request, and the `403 Forbidden` a denial answers with.

The rules are kube-apiserver's: `RequestInfoFactory` turns a URL into (verb, group, resource, subresource,
namespace, name) or a non-resource path; a rule allows a request when its verbs, apiGroups, resources
(`*`, `resource/subresource`, `*/subresource`), resourceNames and nonResourceURLs (`*`, exact, `prefix*`) all
match; ClusterRoleBindings apply everywhere, RoleBindings (to a Role or a ClusterRole) only in their own
namespace. Members of `system:masters` may do anything. `bootstrap_policy()` holds the default grants of a
real cluster (discovery, health and self-reviews for every authenticated user).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from specfleet.cluster.apiserver.errors import ApiError

RBAC_GROUP = "rbac.authorization.k8s.io"
ROLES, ROLE_BINDINGS = f"{RBAC_GROUP}/roles", f"{RBAC_GROUP}/rolebindings"
CLUSTER_ROLES, CLUSTER_ROLE_BINDINGS = f"{RBAC_GROUP}/clusterroles", f"{RBAC_GROUP}/clusterrolebindings"
RBAC_KEYS = frozenset({ROLES, ROLE_BINDINGS, CLUSTER_ROLES, CLUSTER_ROLE_BINDINGS})
MASTERS = "system:masters"
METHOD_VERBS = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch",
                "DELETE": "delete"}
NAMESPACE_SUBRESOURCES = ("status", "finalize")


@dataclass(frozen=True)
class User:
    """Who sent a request, as authentication found it."""
    name: str
    groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class RequestInfo:
    """What a request asks to do, in RBAC's terms (`path` only for non-resource requests)."""
    verb: str
    resource_request: bool = True
    group: str = ""
    version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""

    @property
    def combined_resource(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


def request_info(method: str, path: str, query: dict[str, str] | None = None) -> RequestInfo:
    """kube-apiserver's reading of a request: `/api[s]/...` URLs are resource requests, anything else a path."""
    query = query or {}
    parts = [p for p in path.strip("/").split("/")]
    non_resource = RequestInfo(method.lower(), resource_request=False, path=path)
    if len(parts) < 3 or parts[0] not in ("api", "apis") or (parts[0] == "apis" and len(parts) < 4):
        return non_resource
    group, parts = (parts[1], parts[2:]) if parts[0] == "apis" else ("", parts[1:])
    version, parts = parts[0], parts[1:]
    if parts[0] == "watch":
        if len(parts) < 2:
            return non_resource
        verb, parts = "watch", parts[1:]
    else:
        verb = METHOD_VERBS.get(method.upper(), method.lower())
    namespace = ""
    if parts[0] == "namespaces" and len(parts) > 1:
        namespace = parts[1]
        if len(parts) > 2 and parts[2] not in NAMESPACE_SUBRESOURCES:
            parts = parts[2:]
    resource = parts[0]
    name = parts[1] if len(parts) > 1 else ""
    subresource = parts[2] if len(parts) > 2 else ""
    if not name and verb == "get":
        verb = "watch" if _truthy(query.get("watch")) else "list"
        name = _exact_name(query.get("fieldSelector") or "")
    if not name and verb == "delete":
        verb = "deletecollection"
    return RequestInfo(verb, True, group, version, resource, subresource, namespace, name)


def _truthy(value: str | None) -> bool:
    return value is not None and value not in ("", "0") and value.lower() != "false"


def _exact_name(selector: str) -> str:
    """The name a `metadata.name=x` field selector pins a list or watch to (RBAC's resourceNames see it)."""
    for term in selector.split(","):
        for op in ("==", "="):
            key, sep, value = term.partition(op)
            if sep and key.strip() == "metadata.name" and not key.endswith("!"):
                return value.strip()
    return ""


# ------------------------------------------------------------------ rules
@dataclass(frozen=True)
class Rule:
    """One PolicyRule."""
    verbs: frozenset[str] = frozenset()
    api_groups: frozenset[str] = frozenset()
    resources: tuple[str, ...] = ()
    resource_names: frozenset[str] = frozenset()
    non_resource_urls: tuple[str, ...] = ()

    @classmethod
    def parse(cls, rule: dict[str, Any]) -> "Rule":
        return cls(frozenset(rule.get("verbs") or ()), frozenset(rule.get("apiGroups") or ()),
                   tuple(rule.get("resources") or ()), frozenset(rule.get("resourceNames") or ()),
                   tuple(rule.get("nonResourceURLs") or ()))

    def allows(self, info: RequestInfo) -> bool:
        if "*" not in self.verbs and info.verb not in self.verbs:
            return False
        if not info.resource_request:
            return any(u == "*" or u == info.path or (u.endswith("*") and info.path.startswith(u.rstrip("*")))
                       for u in self.non_resource_urls)
        return (("*" in self.api_groups or info.group in self.api_groups) and self._resource_matches(info)
                and (not self.resource_names or info.name in self.resource_names))

    def _resource_matches(self, info: RequestInfo) -> bool:
        combined, sub = info.combined_resource, info.subresource
        return any(r == "*" or r == combined or (sub and r == f"*/{sub}") for r in self.resources)


def parse_rules(role: dict[str, Any]) -> tuple[Rule, ...]:
    return tuple(Rule.parse(r) for r in role.get("rules") or [] if isinstance(r, dict))


# ------------------------------------------------------------------ policy
SubjectKey = tuple[str, str]          # ("User" | "Group", name); a ServiceAccount is its user name


@dataclass(frozen=True)
class Binding:
    """A RoleBinding (`namespace` set) or ClusterRoleBinding, reduced to what it grants."""
    namespace: str
    name: str
    role_kind: str
    role_name: str


def subject_keys(subject: dict[str, Any], binding_namespace: str) -> SubjectKey | None:
    kind, name = subject.get("kind"), subject.get("name") or ""
    if kind == "ServiceAccount":
        return "User", f"system:serviceaccount:{subject.get('namespace') or binding_namespace}:{name}"
    if kind in ("User", "Group"):
        return kind, name
    return None


def user_keys(user: User) -> list[SubjectKey]:
    return [("User", user.name)] + [("Group", g) for g in user.groups]


@dataclass
class Policy:
    """Every Role, ClusterRole and binding, indexed by subject: looking a user up costs its own bindings."""
    roles: dict[tuple[str, str], tuple[Rule, ...]] = field(default_factory=dict)
    cluster_roles: dict[str, tuple[Rule, ...]] = field(default_factory=dict)
    cluster_bindings: dict[SubjectKey, list[Binding]] = field(default_factory=dict)
    bindings: dict[tuple[str, SubjectKey], list[Binding]] = field(default_factory=dict)

    @classmethod
    def build(cls, roles: Iterable[dict], cluster_roles: Iterable[dict], role_bindings: Iterable[dict],
              cluster_role_bindings: Iterable[dict]) -> "Policy":
        policy = cls()
        for role in roles:
            m = role["metadata"]
            policy.roles[(m.get("namespace", ""), m["name"])] = parse_rules(role)
        for role in cluster_roles:
            policy.cluster_roles[role["metadata"]["name"]] = parse_rules(role)
        for rb in role_bindings:
            policy._add(rb, rb["metadata"].get("namespace", ""))
        for crb in cluster_role_bindings:
            policy._add(crb, "")
        return policy

    def _add(self, obj: dict[str, Any], namespace: str) -> None:
        ref = obj.get("roleRef") or {}
        binding = Binding(namespace, obj["metadata"]["name"], ref.get("kind", ""), ref.get("name", ""))
        for subject in obj.get("subjects") or []:
            key = subject_keys(subject, namespace) if isinstance(subject, dict) else None
            if key is None:
                continue
            if namespace:
                self.bindings.setdefault((namespace, key), []).append(binding)
            else:
                self.cluster_bindings.setdefault(key, []).append(binding)

    def bindings_of(self, user: User, namespace: str) -> Iterator[Binding]:
        """The user's ClusterRoleBindings, then its RoleBindings in `namespace` (each once)."""
        seen: set[Binding] = set()
        keys = user_keys(user)
        for table, lookup in ((self.cluster_bindings, keys), (self.bindings, [(namespace, k) for k in keys])):
            if table is self.bindings and not namespace:
                continue
            for key in lookup:
                for binding in table.get(key, ()):           # type: ignore[call-overload]
                    if binding not in seen:
                        seen.add(binding)
                        yield binding

    def rules_of(self, binding: Binding) -> tuple[Rule, ...] | None:
        """The bound role's rules; None when the role does not exist (or a RoleBinding names a bad kind)."""
        if binding.role_kind == "ClusterRole":
            return self.cluster_roles.get(binding.role_name)
        if binding.role_kind == "Role" and binding.namespace:
            return self.roles.get((binding.namespace, binding.role_name))
        return None


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str = ""                     # RBAC's explanation of a denial (bindings to missing roles)


def authorize(policy: Policy, user: User, info: RequestInfo) -> Decision:
    if MASTERS in user.groups:
        return Decision(True)
    missing: list[str] = []
    for binding in policy.bindings_of(user, info.namespace if info.resource_request else ""):
        rules = policy.rules_of(binding)
        if rules is None:
            missing.append(f'{binding.role_kind.lower()}.{RBAC_GROUP} "{binding.role_name}" not found')
        elif any(rule.allows(info) for rule in rules):
            return Decision(True)
    if not missing:
        return Decision(False)
    errors = missing[0] if len(missing) == 1 else "[" + ", ".join(missing) + "]"
    return Decision(False, f"RBAC: {errors}")


# ------------------------------------------------------------------ denial
class Forbidden(ApiError):
    """403 with the real server's body: `details` is present even when empty (non-resource paths)."""

    def status(self) -> dict[str, Any]:
        return {**super().status(), "details": self.details}


def forbidden(user: User, info: RequestInfo, reason: str = "") -> Forbidden:
    """The real server's wording (`responsewriters.forbiddenMessage` wrapped by `NewForbidden`)."""
    if not info.resource_request:
        why = f'User "{user.name}" cannot {info.verb} path "{info.path}"'
    elif info.namespace:
        why = (f'User "{user.name}" cannot {info.verb} resource "{info.combined_resource}" in API group '
               f'"{info.group}" in the namespace "{info.namespace}"')
    else:
        why = (f'User "{user.name}" cannot {info.verb} resource "{info.combined_resource}" in API group '
               f'"{info.group}" at the cluster scope')
    if reason:
        why = f"{why}: {reason}"
    if not info.resource_request or not info.resource:
        return Forbidden(403, "Forbidden", f"forbidden: {why}", {})
    label = f"{info.resource}.{info.group}" if info.group else info.resource
    subject = f'{label} "{info.name}"' if info.name else label
    details = {**({"name": info.name} if info.name else {}), **({"group": info.group} if info.group else {}),
               "kind": info.resource}
    return Forbidden(403, "Forbidden", f"{subject} is forbidden: {why}", details)


# ------------------------------------------------------------------ a real cluster's default grants
DISCOVERY_URLS = ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*",
                  "/readyz", "/version", "/version/"]
PUBLIC_INFO_URLS = ["/healthz", "/livez", "/readyz", "/version", "/version/"]


def bootstrap_policy() -> list[tuple[str, dict[str, Any]]]:
    """(storage key, object) for the default ClusterRoles and ClusterRoleBindings every cluster starts with."""
    def role(name: str, rules: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
        return CLUSTER_ROLES, {"apiVersion": f"{RBAC_GROUP}/v1", "kind": "ClusterRole",
                               "metadata": _bootstrap_meta(name), "rules": rules}

    def binding(name: str, *groups: str) -> tuple[str, dict[str, Any]]:
        return CLUSTER_ROLE_BINDINGS, {
            "apiVersion": f"{RBAC_GROUP}/v1", "kind": "ClusterRoleBinding", "metadata": _bootstrap_meta(name),
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": RBAC_GROUP, "kind": "Group", "name": g} for g in groups]}

    return [
        role("cluster-admin", [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                               {"nonResourceURLs": ["*"], "verbs": ["*"]}]),
        binding("cluster-admin", MASTERS),
        role("system:discovery", [{"nonResourceURLs": DISCOVERY_URLS, "verbs": ["get"]}]),
        binding("system:discovery", "system:authenticated"),
        role("system:basic-user", [
            {"apiGroups": ["authorization.k8s.io"], "resources": ["selfsubjectaccessreviews",
                                                                   "selfsubjectrulesreviews"], "verbs": ["create"]},
            {"apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"], "verbs": ["create"]}]),
        binding("system:basic-user", "system:authenticated"),
        role("system:public-info-viewer", [{"nonResourceURLs": PUBLIC_INFO_URLS, "verbs": ["get"]}]),
        binding("system:public-info-viewer", "system:authenticated", "system:unauthenticated"),
    ]


def _bootstrap_meta(name: str) -> dict[str, Any]:
    return {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
            "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}}
