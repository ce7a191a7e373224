"""Authentication: who a request comes from, decided from its bearer token before routing.

- The emulator's admin token (`kubeconfig.TOKEN`) is `system:admin` in `system:masters` (allowed anything).
- ServiceAccount tokens come from the TokenRequest API (`POST .../serviceaccounts/NAME/token`, what
  `kubectl create token` sends): opaque random strings the server keeps (as SHA-256 digests) with their
  expiry and the account's uid, so a deleted (or deleted and recreated) account's tokens stop working. They
  are `system:serviceaccount:NS:NAME` in `system:serviceaccounts`, `system:serviceaccounts:NS` and
  `system:authenticated`. With a state file they survive a restart, as a real cluster's signed tokens do.
- No `Authorization: Bearer` header on the HTTPS port: `system:anonymous` in `system:unauthenticated` (RBAC
  lets it read /healthz, /livez, /readyz and /version). On the plain-HTTP port such a request acts as the admin,
  as kube-apiserver's old insecure port did (kubectl never sends credentials over plain HTTP, and the local
  fleet's own tools use that port); `ServerConfig(local_admin=False)` makes it anonymous there too.
- An unknown or expired bearer token, on either port: `401 Unauthorized`.
"""
from __future__ import annotations

import datetime
import hashlib
import secrets
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from aiohttp import web

from specfleet.cluster.apiserver import errors
from specfleet.cluster.apiserver.errors import ApiError, Cause
from specfleet.cluster.apiserver.kubeconfig import TOKEN
from specfleet.cluster.apiserver.rbac import User
from specfleet.cluster.apiserver.store import Store

SA_KEY = "/serviceaccounts"
ADMIN = User("system:admin", ("system:masters", "system:authenticated"))
ANONYMOUS = User("system:anonymous", ("system:unauthenticated",))
UNAUTHORIZED = ApiError(401, "Unauthorized", "Unauthorized")
DEFAULT_EXPIRATION_S = 3600
MIN_EXPIRATION_S = 600
MAX_EXPIRATION_S = 2 ** 32
AUDIENCES = ["https://kubernetes.default.svc.cluster.local"]
USER = web.RequestKey("user", User)     # who sent the request, set before routing
OPEN_PREFIXES = ("/_faults",)            # the test-only fault injection endpoint (faults.py) is not an API path


def service_account_user(namespace: str, name: str) -> User:
    return User(f"system:serviceaccount:{namespace}:{name}",
                ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"))


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass
class IssuedToken:
    namespace: str
    name: str
    uid: str                 # the ServiceAccount's uid when issued
    expires: float           # epoch seconds


@dataclass
class TokenAuthority:
    """Issues ServiceAccount tokens and says whose a token is."""
    store: Store
    clock: Callable[[], float] = time.time
    tokens: dict[str, IssuedToken] = field(default_factory=dict)       # digest -> token
    on_change: list[Callable[[], None]] = field(default_factory=list)  # persistence's save trigger
    lock: threading.Lock = field(default_factory=threading.Lock)

    def issue(self, namespace: str, name: str, seconds: int = DEFAULT_EXPIRATION_S) -> tuple[str, float]:
        """A new token for an existing ServiceAccount (404 otherwise) and its expiry (epoch seconds)."""
        account = self.store.get(SA_KEY, namespace, name)
        if account is None:
            raise errors.not_found("serviceaccounts", "", name)
        token, expires = secrets.token_urlsafe(32), self.clock() + seconds
        with self.lock:
            now = self.clock()
            self.tokens = {k: t for k, t in self.tokens.items() if t.expires > now}
            self.tokens[digest(token)] = IssuedToken(namespace, name, account["metadata"].get("uid", ""), expires)
        for callback in self.on_change:
            callback()
        return token, expires

    def user(self, token: str) -> User | None:
        issued = self.tokens.get(digest(token))
        if issued is None or issued.expires <= self.clock():
            return None
        account = self.store.get(SA_KEY, issued.namespace, issued.name)
        if account is None or account["metadata"].get("uid", "") != issued.uid:
            return None
        return service_account_user(issued.namespace, issued.name)

    def snapshot(self) -> list[dict[str, Any]]:
        with self.lock:
            return [{"digest": k, **asdict(t)} for k, t in self.tokens.items()]

    def restore(self, items: list[dict[str, Any]]) -> None:
        with self.lock:
            for item in items:
                fields = {k: v for k, v in item.items() if k != "digest"}
                self.tokens[item["digest"]] = IssuedToken(**fields)


@dataclass
class Authenticator:
    """Authorization header -> User; raises 401 for a bearer token nobody issued (or one that expired)."""
    tokens: TokenAuthority
    admin_token: str = TOKEN
    local_admin: bool = True                       # no credentials over plain HTTP: the admin (see module doc)

    def authenticate(self, header: str | None, secure: bool = True) -> User:
        parts = (header or "").strip().split(" ", 2)
        if len(parts) < 2 or parts[0].lower() != "bearer" or not parts[1]:
            # as kube-apiserver: not a bearer token, so no opinion (on the HTTP port, the local admin)
            return ADMIN if self.local_admin and not secure else ANONYMOUS
        if secrets.compare_digest(parts[1], self.admin_token):
            return ADMIN
        user = self.tokens.user(parts[1])
        if user is None:
            raise UNAUTHORIZED
        return user

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if not request.path.startswith(OPEN_PREFIXES):
            request[USER] = self.authenticate(request.headers.get("Authorization"), request.secure)
        return await handler(request)


# ------------------------------------------------------------------ TokenRequest
def token_request(authority: TokenAuthority, namespace: str, name: str, body: Any) -> dict[str, Any]:
    """POST serviceaccounts/NAME/token: the issued `TokenRequest` (authentication.k8s.io/v1)."""
    spec = (body.get("spec") if isinstance(body, dict) else None) or {}
    seconds = spec.get("expirationSeconds")
    seconds = DEFAULT_EXPIRATION_S if seconds is None else seconds
    check_expiration(name, seconds)
    token, expires = authority.issue(namespace, name, int(seconds))
    stamp = datetime.datetime.fromtimestamp(expires, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": name, "namespace": namespace, "creationTimestamp": None},
            "spec": {"audiences": spec.get("audiences") or AUDIENCES, "expirationSeconds": int(seconds),
                     "boundObjectRef": spec.get("boundObjectRef")},
            "status": {"token": token, "expirationTimestamp": stamp}}


def check_expiration(name: str, seconds: Any) -> None:
    """ValidateTokenRequest: at least 10 minutes, at most 2^32 seconds."""
    why = None
    if not isinstance(seconds, int) or isinstance(seconds, bool):
        why = f"Invalid value: {seconds!r}: must be an integer"
    elif seconds < MIN_EXPIRATION_S:
        why = f"Invalid value: {seconds}: may not specify a duration less than 10 minutes"
    elif seconds > MAX_EXPIRATION_S:
        why = f"Invalid value: {seconds}: may not specify a duration larger than 2^32 seconds"
    if why:
        raise errors.invalid("TokenRequest", "authentication.k8s.io", name,
                             [Cause("FieldValueInvalid", why, "spec.expirationSeconds")])


def self_subject_review(user: User) -> dict[str, Any]:
    """POST authentication.k8s.io/v1 selfsubjectreviews (`kubectl auth whoami`)."""
    return {"kind": "SelfSubjectReview", "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": None},
            "status": {"userInfo": {"username": user.name, "groups": list(user.groups)}}}
