"""API errors as Kubernetes `Status` objects (404/409/410/422 ...), raised anywhere and rendered by the server."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Cause:
    """One entry of `details.causes`: a field path and what is wrong with it."""
    reason: str
    message: str
    field: str = ""

    def as_dict(self) -> dict[str, str]:
        out = {"reason": self.reason, "message": self.message}
        if self.field:
            out["field"] = self.field
        return out


@dataclass
class ApiError(Exception):
    """An error the API answers with: an HTTP code, a machine reason and a `Status` body."""
    code: int
    reason: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.code} {self.reason}: {self.message}"

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                "message": self.message, "reason": self.reason, "code": self.code}
        if self.details:
            body["details"] = self.details
        return body


def resource_label(plural: str, group: str) -> str:
    """`deployments.apps` / `pods`: how the server names a resource in messages."""
    return f"{plural}.{group}" if group else plural


def not_found(plural: str, group: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{resource_label(plural, group)} "{name}" not found',
                    {"name": name, "group": group, "kind": plural})


def already_exists(plural: str, group: str, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{resource_label(plural, group)} "{name}" already exists',
                    {"name": name, "group": group, "kind": plural})


def conflict(plural: str, group: str, name: str, why: str) -> ApiError:
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {resource_label(plural, group)} '
                    f'"{name}": {why}', {"name": name, "group": group, "kind": plural})


def stale_update(plural: str, group: str, name: str) -> ApiError:
    return conflict(plural, group, name, "the object has been modified; please apply your changes to the "
                    "latest version and try again")


def gone(message: str = "too old resource version") -> ApiError:
    return ApiError(410, "Expired", message)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def invalid(kind: str, group: str, name: str, causes: list[Cause]) -> ApiError:
    """422 Invalid, worded like the real server: `Kind.group "name" is invalid: path: message, ...`."""
    label = f"{kind}.{group}" if group else kind
    parts = [f"{c.field}: {c.message}" if c.field else c.message for c in causes]
    text = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    return ApiError(422, "Invalid", f'{label} "{name}" is invalid: {text}',
                    {"name": name, "group": group, "kind": kind, "causes": [c.as_dict() for c in causes]})


def unsupported_media(message: str) -> ApiError:
    return ApiError(415, "UnsupportedMediaType", message)


def method_not_allowed(message: str = "the server does not allow this method on the requested resource") -> ApiError:
    return ApiError(405, "MethodNotAllowed", message)
