"""Authorization against the store's RBAC objects: the policy (rbac.Policy) is built once and rebuilt only
after a Role, ClusterRole or binding changes, so a request costs the user's own bindings, not a scan.

Every denial is answered `403` (rbac.forbidden), logged at WARNING, and kept in `Authorizer.denials`
(bounded) so tests can assert there were none, or find one. `SelfSubjectAccessReview` (`kubectl auth can-i`)
asks the same question without the request.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from specfleet.cluster.apiserver import rbac
from specfleet.cluster.apiserver.auth import ANONYMOUS, OPEN_PREFIXES, USER, service_account_user
from specfleet.cluster.apiserver.rbac import Decision, Policy, RequestInfo, User
from specfleet.cluster.apiserver.store import Event, Store

log = logging.getLogger(__name__)
MAX_DENIALS = 10_000


@dataclass(frozen=True)
class Denial:
    """One refused request, as RBAC saw it."""
    user: str
    groups: tuple[str, ...]
    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str
    name: str
    path: str
    message: str
    time: float


@dataclass
class Authorizer:
    store: Store
    denials: deque = field(default_factory=lambda: deque(maxlen=MAX_DENIALS))
    _policy: Policy | None = None

    def __post_init__(self) -> None:
        self.store.listeners.append(self._on_event)

    def _on_event(self, event: Event) -> None:
        if event.key in rbac.RBAC_KEYS:
            self._policy = None                     # called under the store's lock, like `policy()` builds

    def policy(self) -> Policy:
        policy = self._policy
        if policy is None:
            with self.store.lock:
                policy = self._policy = Policy.build(
                    self.store.list(rbac.ROLES), self.store.list(rbac.CLUSTER_ROLES),
                    self.store.list(rbac.ROLE_BINDINGS), self.store.list(rbac.CLUSTER_ROLE_BINDINGS))
        return policy

    def decide(self, user: User, info: RequestInfo) -> Decision:
        return rbac.authorize(self.policy(), user, info)

    def check(self, user: User, info: RequestInfo) -> None:
        """Raise the real server's 403 (and record it) unless RBAC allows the request."""
        decision = self.decide(user, info)
        if decision.allowed:
            return
        error = rbac.forbidden(user, info, decision.reason)
        self.denials.append(Denial(user.name, user.groups, info.verb, info.group, info.resource, info.subresource,
                                   info.namespace, info.name, info.path, error.message, time.time()))
        log.warning("RBAC denied: %s", error.message)
        raise error

    def denied(self, user: str | None = None, verb: str | None = None, resource: str | None = None) -> list[Denial]:
        """The recorded denials, optionally narrowed by user, verb and resource (`resource/subresource` too)."""
        return [d for d in list(self.denials) if (user is None or d.user == user) and (verb is None or d.verb == verb)
                and (resource is None or resource in (d.resource, f"{d.resource}/{d.subresource}"))]

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if not request.path.startswith(OPEN_PREFIXES):
            user = request.get(USER, ANONYMOUS)
            if "Impersonate-User" in request.headers:
                user = request[USER] = self.impersonate(user, request.headers["Impersonate-User"],
                                                          tuple(request.headers.getall("Impersonate-Group", ())))
            self.check(user, rbac.request_info(request.method, request.path, dict(request.query)))
        return await handler(request)

    def impersonate(self, user: User, name: str, groups: tuple[str, ...]) -> User:
        """`kubectl --as NAME [--as-group G]`: allowed by the verb `impersonate` on users, serviceaccounts, groups."""
        prefix = "system:serviceaccount:"
        if name.startswith(prefix) and name.count(":") == 3:
            namespace, account = name[len(prefix):].split(":")
            self.check(user, RequestInfo("impersonate", True, resource="serviceaccounts", namespace=namespace,
                                         name=account))
            target = service_account_user(namespace, account)
        else:
            self.check(user, RequestInfo("impersonate", True, resource="users", name=name))
            target = User(name, ())
        for group in groups:
            self.check(user, RequestInfo("impersonate", True, resource="groups", name=group))
        extra = groups or target.groups
        return User(target.name, tuple(dict.fromkeys([*extra, "system:authenticated"])))

    # ------------------------------------------------------------ SelfSubjectAccessReview
    def access_review(self, user: User, body: Any) -> dict[str, Any]:
        spec = (body.get("spec") if isinstance(body, dict) else None) or {}
        res, non = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
        if res:
            info = RequestInfo(res.get("verb", ""), True, res.get("group", ""), res.get("version", ""),
                               res.get("resource", ""), res.get("subresource", ""), res.get("namespace", ""),
                               res.get("name", ""))
        else:
            non = non or {}
            info = RequestInfo(non.get("verb", ""), False, path=non.get("path", ""))
        decision = self.decide(user, info)
        status: dict[str, Any] = {"allowed": decision.allowed}
        if decision.reason:
            status["reason"] = decision.reason
        return {"kind": "SelfSubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
                "metadata": {"creationTimestamp": None}, "spec": spec, "status": status}
