"""Server-set object metadata: uids, timestamps, generated names, name validation."""
from __future__ import annotations

import json
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


# ---------------------------------------------------------------- labels, annotations, owner references
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
ANNOTATIONS_LIMIT = 256 * 1024
LABEL_VALUE_HELP = ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
                    "and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or "
                    "'12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')")
NAME_PART_HELP = ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
                  "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
                  "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")


def invalid_value(field: str, value: str, detail: str) -> Cause:
    return Cause("FieldValueInvalid", f"Invalid value: {json.dumps(value)}: {detail}", field)


def key_causes(key: str, field: str) -> list[Cause]:
    """A qualified name: an optional DNS-subdomain prefix and '/', then a name part of at most 63 characters."""
    prefix, _, name = key.rpartition("/")
    out = []
    if prefix and (len(prefix) > 253 or not DNS_SUBDOMAIN.match(prefix)):
        out.append(invalid_value(field, key, "prefix part a lowercase RFC 1123 subdomain must consist of lower case "
                                 "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric "
                                 "character"))
    if not name:
        out.append(invalid_value(field, key, "name part must be non-empty"))
    elif len(name) > 63:
        out.append(invalid_value(field, key, "name part must be no more than 63 characters"))
    elif not NAME_PART.match(name):
        out.append(invalid_value(field, key, NAME_PART_HELP))
    return out


def metadata_causes(m: dict[str, Any]) -> list[Cause]:
    """ValidateObjectMeta's checks on labels, annotations and owner references (names are checked apart)."""
    out: list[Cause] = []
    for key, value in (m.get("labels") or {}).items():
        out += key_causes(key, "metadata.labels")
        if not isinstance(value, str):
            continue
        if len(value) > 63:
            out.append(invalid_value("metadata.labels", value, "must be no more than 63 characters"))
        elif not LABEL_VALUE.match(value):
            out.append(invalid_value("metadata.labels", value, LABEL_VALUE_HELP))
    annotations = m.get("annotations") or {}
    for key in annotations:
        out += key_causes(key.lower(), "metadata.annotations")
    if sum(len(k) + len(str(v)) for k, v in annotations.items()) > ANNOTATIONS_LIMIT:
        out.append(Cause("FieldValueTooLong", f"Too long: must have at most {ANNOTATIONS_LIMIT} bytes",
                         "metadata.annotations"))
    for i, ref in enumerate(m.get("ownerReferences") or []):
        out += owner_reference_causes(ref if isinstance(ref, dict) else {}, f"metadata.ownerReferences[{i}]")
    return out


def owner_reference_causes(ref: dict[str, Any], field: str) -> list[Cause]:
    out = []
    for key, what in (("apiVersion", "version must not be empty"), ("kind", "kind must not be empty"),
                      ("name", "name must not be empty"), ("uid", "uid must not be empty")):
        if not ref.get(key):
            out.append(invalid_value(f"{field}.{key}", ref.get(key) or "", what))
    return out
