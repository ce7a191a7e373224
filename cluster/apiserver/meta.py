"""Server-set object metadata: uids, timestamps, generated names, name validation."""
from __future__ import annotations

import random
import re
import uuid
from datetime import datetime, timezone
from typing import Any

from specfleet.cluster.apiserver.errors import Cause

NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
#: metadata fields that the server owns; clients cannot change them on update.
SERVER_FIELDS = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                 "generation", "resourceVersion", "selfLink")


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


def new_uid() -> str:
    return str(uuid.uuid4())


def generated_name(prefix: str) -> str:
    return prefix + "".join(random.choice(NAME_CHARS) for _ in range(5))


def name_causes(name: str, label_only: bool = False) -> list[Cause]:
    """Validation errors for metadata.name (DNS-1123 subdomain, or label for namespaces and services)."""
    if not name:
        return [Cause("FieldValueRequired", "Required value: name or generateName is required", "metadata.name")]
    pattern, limit = (DNS_LABEL, 63) if label_only else (DNS_SUBDOMAIN, 253)
    if len(name) > limit or not pattern.match(name):
        what = "RFC 1123 label" if label_only else "RFC 1123 subdomain"
        return [Cause("FieldValueInvalid", f'Invalid value: "{name}": a lowercase {what} must consist of lower '
                      "case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric "
                      "character", "metadata.name")]
    return []


def meta(obj: dict[str, Any]) -> dict[str, Any]:
    """The object's metadata dict, created when missing."""
    m = obj.get("metadata")
    if not isinstance(m, dict):
        m = obj["metadata"] = {}
    return m


def object_key(obj: dict[str, Any]) -> tuple[str, str]:
    m = obj.get("metadata") or {}
    return m.get("namespace", "") or "", m.get("name", "")
