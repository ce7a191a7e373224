"""API keys on the gateway: from files and from a Secret the gateway watches.

Keys come from `--api-key-file` (one per line, as the engine reads them) and from every value of a
Secret (`--api-key-secret NS/NAME`, each value one key per line), replaced whenever the Secret
changes. Once any source is configured every request outside the open paths needs
`Authorization: Bearer <key>`; a configured Secret that is missing or empty locks the door rather
than opening it. The comparison is the engine's (`specfleet.engine.server.auth.matches`, constant
time), so the gateway and the engine accept exactly the same keys.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass, field

from specfleet.engine.server.auth import bearer, matches, read_key_file

OPEN_PATHS = frozenset({"/health", "/ready", "/metrics"})


def parse_secret_ref(text: str) -> tuple[str, str]:
    """"namespace/name" -> (namespace, name)."""
    namespace, sep, name = text.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ValueError(f"--api-key-secret must be NAMESPACE/NAME, not {text!r}")
    return namespace, name


def keys_in_secret(secret: dict | None) -> tuple[str, ...]:
    """Every non-blank, non-comment line of every value (`data` base64, `stringData` plain)."""
    if not secret:
        return ()
    values = [base64.b64decode(v).decode() for v in (secret.get("data") or {}).values()]
    values += list((secret.get("stringData") or {}).values())
    lines = (line.strip() for value in values for line in value.splitlines())
    return tuple(dict.fromkeys(line for line in lines if line and not line.startswith("#")))


@dataclass
class ApiKeys:
    file_keys: tuple[str, ...] = ()
    secret: tuple[str, str] | None = None        # (namespace, name) of the watched Secret
    secret_keys: tuple[str, ...] = field(default=(), repr=False)

    def __repr__(self) -> str:                     # never print a key
        return f"ApiKeys(files=<{len(self.file_keys)}>, secret={self.secret}, secret_keys=<{len(self.secret_keys)}>)"

    @classmethod
    def from_flags(cls, key_files: list[str], secret: str | None) -> "ApiKeys":
        keys = tuple(dict.fromkeys(k for path in key_files for k in read_key_file(path)))
        return cls(keys, parse_secret_ref(secret) if secret else None)

    @property
    def locked(self) -> bool:
        return bool(self.file_keys) or self.secret is not None

    def accepted(self, authorization: str | None) -> bool:
        if not self.locked:
            return True
        given = bearer(authorization)
        return given is not None and matches(given, (*self.file_keys, *self.secret_keys))
