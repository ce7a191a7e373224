"""Who may call what: API keys for the OpenAI endpoints, a bearer token for the admin API.

`Access` holds the secrets a server was started with. `ApiKeyGate` is the ASGI middleware that, once
keys are configured, answers 401 (the OpenAI error shape, as the `openai` client expects) to any request
without a listed key, before the body is read or the request counts against the admission limit. Only
probes and scrapers (`/health`, `/ready`, `/metrics`) pass without a key, and `/admin/*` and vLLM's
`/v1/load_lora_adapter`, `/v1/unload_lora_adapter`, which need the admin token instead. The admin API
is off unless a token is configured: without one it answers 403, with one it
needs `Authorization: Bearer <token>`. Every comparison is constant time over SHA-256 digests, so
neither a key's content nor its length leaks through timing.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from specfleet.engine.server.openai_protocol import OpenAIError, error_body

API_KEY_ENV = "SPECFLEET_API_KEY"
OPEN_PATHS = frozenset({"/health", "/ready", "/metrics"})
ADMIN_PREFIX = "/admin"
ADMIN_PATHS = frozenset({"/v1/load_lora_adapter", "/v1/unload_lora_adapter"})    # vLLM's paths, our admin token


@dataclass(frozen=True)
class Access:
    api_keys: tuple[str, ...] = ()         # empty: the OpenAI endpoints are open (as vLLM without --api-key)
    admin_token: str | None = None         # None: the admin API is off

    def __post_init__(self) -> None:
        if any(not key or key != key.strip() for key in self.api_keys):
            raise ValueError("API keys must be non-empty and carry no surrounding whitespace")
        if self.admin_token is not None and (not self.admin_token or self.admin_token != self.admin_token.strip()):
            raise ValueError("the admin token must be non-empty and carry no surrounding whitespace")

    def __repr__(self) -> str:              # never print a secret, not even in a traceback
        return f"Access(api_keys=<{len(self.api_keys)}>, admin_token={'<set>' if self.admin_token else None})"

    def key_accepted(self, given: str | None) -> bool:
        return not self.api_keys or (given is not None and matches(given, self.api_keys))


def matches(given: str, secrets: Iterable[str]) -> bool:
    """True if `given` equals one of `secrets`; compares against every one, each in constant time."""
    digest = _sha256(given)
    found = False
    for secret in secrets:
        found |= hmac.compare_digest(digest, _sha256(secret))
    return found


def _sha256(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def bearer(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header; None for a missing header or another scheme."""
    scheme, _, token = (authorization or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def read_token_file(path: str | Path) -> str:
    """The admin token: the whole file, stripped (a mounted Secret's key)."""
    token = Path(path).read_text(encoding="utf-8").strip()
    if not token:
        raise ValueError(f"admin token file {path} is empty")
    return token


def read_key_file(path: str | Path) -> list[str]:
    """API keys, one per line; blank lines and lines starting with `#` are skipped."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    keys = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
    if not keys:
        raise ValueError(f"API key file {path} holds no key")
    return keys


def load_api_keys(keys: Iterable[str] = (), key_files: Iterable[str | Path] = (),
                  environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """Keys from `--api-key`, `--api-key-file` and `SPECFLEET_API_KEY`, in that order, without duplicates."""
    found = [key.strip() for key in keys]
    for path in key_files:
        found += read_key_file(path)
    if environ.get(API_KEY_ENV, "").strip():
        found.append(environ[API_KEY_ENV].strip())
    if any(not key for key in found):
        raise ValueError("an API key is empty")
    return tuple(dict.fromkeys(found))


def require_admin(access: Access, authorization: str | None) -> None:
    """Raises the OpenAI-shaped error for an admin call that may not pass."""
    if access.admin_token is None:
        raise OpenAIError(403, "the admin API is off: start the engine with --admin-token-file to enable it",
                          "permission_error", code="admin_api_disabled")
    given = bearer(authorization)
    if given is None or not matches(given, (access.admin_token,)):
        raise OpenAIError(401, "missing or wrong admin bearer token", "authentication_error",
                          code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


class ApiKeyGate:
    """ASGI middleware: with keys configured, every path but the open ones and `/admin` needs
    `Authorization: Bearer <key>` with one of them, else 401 (deny by default: a new route is locked)."""

    def __init__(self, app, access: Access) -> None:
        self.app, self.access = app, access

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not self.access.api_keys or _exempt(scope["path"]):
            return await self.app(scope, receive, send)
        authorization = _header(scope, b"authorization")
        if self.access.key_accepted(bearer(authorization)):
            return await self.app(scope, receive, send)
        message = ("missing API key: send 'Authorization: Bearer <key>'" if authorization is None
                   else "incorrect API key provided")
        body = json.dumps(error_body(message, "authentication_error", None, "invalid_api_key")).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})


def _exempt(path: str) -> bool:
    return (path in OPEN_PATHS or path in ADMIN_PATHS or path == ADMIN_PREFIX
            or path.startswith(ADMIN_PREFIX + "/"))


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None
