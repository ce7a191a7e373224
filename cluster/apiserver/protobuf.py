"""The two protobuf request bodies kubectl sends for authentication, read into their JSON form.

`kubectl create token` (TokenRequest) and `kubectl auth can-i` (SelfSubjectAccessReview) always send
`application/vnd.kubernetes.protobuf`: the `k8s\\0` magic, then a `runtime.Unknown` (1: TypeMeta, 2: the
object's bytes). Only the fields these reviews use are read; the answer goes back as JSON, which client-go
accepts from the response's content type. Every other protobuf body stays `415` (routes.json_body).
"""
from __future__ import annotations

from typing import Any

MAGIC = b"k8s\x00"
Fields = dict[int, list[Any]]          # field number -> values (ints for varints, bytes otherwise)


def is_protobuf(content_type: str) -> bool:
    return "protobuf" in content_type


def read_fields(data: bytes) -> Fields:
    """Protobuf wire format, one level: varints, 64/32-bit fixed values and length-delimited bytes."""
    out: Fields = {}
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            length, pos = _varint(data, pos)
            value, pos = data[pos:pos + length], pos + length
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, pos = int.from_bytes(data[pos:pos + size], "little"), pos + size
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        out.setdefault(number, []).append(value)
    return out


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated protobuf varint")
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if not byte & 0x80:
            return value, pos


def _one(fields: Fields, number: int, default: Any = b"") -> Any:
    return fields.get(number, [default])[-1]


def _text(fields: Fields, number: int) -> str:
    return _one(fields, number).decode()


def unwrap(raw: bytes) -> tuple[str, str, Fields]:
    """(apiVersion, kind, the object's fields) of a `k8s\\0`-framed body."""
    if not raw.startswith(MAGIC):
        raise ValueError("protobuf body without the k8s magic prefix")
    unknown = read_fields(raw[len(MAGIC):])
    type_meta = read_fields(_one(unknown, 1))
    return _text(type_meta, 1), _text(type_meta, 2), read_fields(_one(unknown, 2))


def token_request(obj: Fields) -> dict[str, Any]:
    """TokenRequest: spec (2) = audiences (1, repeated), boundObjectRef (3), expirationSeconds (4)."""
    spec = read_fields(_one(obj, 2))
    out: dict[str, Any] = {"audiences": [a.decode() for a in spec.get(1, [])]}
    if 4 in spec:
        out["expirationSeconds"] = _one(spec, 4)
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": out}


def access_review(obj: Fields) -> dict[str, Any]:
    """SelfSubjectAccessReview: spec (2) = resourceAttributes (1) | nonResourceAttributes (2)."""
    spec = read_fields(_one(obj, 2))
    out: dict[str, Any] = {}
    if 1 in spec:
        attrs = read_fields(_one(spec, 1))
        keys = ("namespace", "verb", "group", "version", "resource", "subresource", "name")
        out["resourceAttributes"] = {k: _text(attrs, i) for i, k in enumerate(keys, 1)}
    if 2 in spec:
        attrs = read_fields(_one(spec, 2))
        out["nonResourceAttributes"] = {"path": _text(attrs, 1), "verb": _text(attrs, 2)}
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "spec": out}


READERS = {"TokenRequest": token_request, "SelfSubjectAccessReview": access_review}


def review_body(raw: bytes, kind: str) -> dict[str, Any]:
    """The JSON form of a protobuf TokenRequest or SelfSubjectAccessReview; ValueError for anything else."""
    _, sent, obj = unwrap(raw)
    if sent != kind:
        raise ValueError(f"expected a {kind}, got {sent or 'no kind'}")
    return READERS[kind](obj)
