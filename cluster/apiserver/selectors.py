"""Label and field selectors: parsing the query-string forms and matching objects against them."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from specfleet.cluster.apiserver.errors import bad_request

SET_RE = re.compile(r"^\s*(!?)([A-Za-z0-9./_-]+)\s*(?:(in|notin)\s*\(([^)]*)\))?\s*$")
EQ_RE = re.compile(r"^\s*([A-Za-z0-9./_-]+)\s*(==|=|!=)\s*([A-Za-z0-9._-]*)\s*$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str             # "=", "!=", "in", "notin", "exists", "!"
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        present, value = self.key in labels, labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        return not present or value not in self.values     # "!=" and "notin"


def split_terms(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    terms, depth, current = [], 0, ""
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += ch
    terms.append(current)
    return [t for t in terms if t.strip()]


def parse_label_selector(text: str | None) -> list[Requirement]:
    reqs = []
    for term in split_terms(text or ""):
        eq = EQ_RE.match(term)
        if eq:
            op = "!=" if eq.group(2) == "!=" else "="
            reqs.append(Requirement(eq.group(1), op, (eq.group(3),)))
            continue
        st = SET_RE.match(term)
        if not st:
            raise bad_request(f'unable to parse requirement: invalid label selector "{term.strip()}"')
        neg, key, op, values = st.groups()
        if op:
            reqs.append(Requirement(key, op, tuple(v.strip() for v in values.split(",") if v.strip())))
        else:
            reqs.append(Requirement(key, "!" if neg else "exists"))
    return reqs


def selector_from_match_labels(selector: dict[str, Any] | None) -> list[Requirement]:
    """A metav1.LabelSelector (matchLabels + matchExpressions) as requirements."""
    selector = selector or {}
    reqs = [Requirement(k, "=", (str(v),)) for k, v in (selector.get("matchLabels") or {}).items()]
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}
    for expr in selector.get("matchExpressions") or []:
        reqs.append(Requirement(expr["key"], ops[expr["operator"]], tuple(expr.get("values") or ())))
    return reqs


def selector_string(selector: dict[str, Any] | None) -> str:
    """The string form of a metav1.LabelSelector, as the scale subresource reports it."""
    parts = []
    for r in selector_from_match_labels(selector):
        if r.op == "=":
            parts.append(f"{r.key}={r.values[0]}")
        elif r.op in ("in", "notin"):
            parts.append(f"{r.key} {r.op} ({','.join(r.values)})")
        else:
            parts.append(r.key if r.op == "exists" else f"!{r.key}")
    return ",".join(parts)


def labels_match(reqs: list[Requirement], obj: dict[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(r.matches(labels) for r in reqs)


@dataclass(frozen=True)
class FieldRequirement:
    path: str
    negate: bool
    value: str


#: the field labels kube-apiserver supports per built-in kind (beyond metadata.name and metadata.namespace).
BUILTIN_FIELD_LABELS: dict[str, tuple[str, ...]] = {
    "/pods": ("spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
              "spec.hostNetwork", "status.phase", "status.podIP", "status.podIPs", "status.nominatedNodeName"),
    "/events": ("involvedObject.kind", "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
                "involvedObject.apiVersion", "involvedObject.resourceVersion", "involvedObject.fieldPath",
                "reason", "reportingComponent", "source", "type"),
    "events.k8s.io/events": ("regarding.kind", "regarding.namespace", "regarding.name", "regarding.uid",
                             "regarding.apiVersion", "regarding.resourceVersion", "regarding.fieldPath", "reason",
                             "reportingController", "type"),
    "/secrets": ("type",), "/namespaces": ("status.phase",), "/nodes": ("spec.unschedulable",),
    "/services": ("spec.clusterIP", "spec.type"), "apps/replicasets": ("status.replicas",),
    "batch/jobs": ("status.successful",),
}


def field_label_allowed(key: str, label: str) -> bool:
    return label in ("metadata.name", "metadata.namespace") or label in BUILTIN_FIELD_LABELS.get(key, ())


def parse_field_selector(text: str | None, allowed: Callable[[str], bool]) -> list[FieldRequirement]:
    reqs = []
    for term in split_terms(text or ""):
        m = re.match(r"^\s*([A-Za-z0-9._-]+)\s*(==|=|!=)\s*(.*?)\s*$", term)
        if not m:
            raise bad_request(f'invalid field selector: "{term}"')
        if not allowed(m.group(1)):
            raise bad_request(f'field label not supported: {m.group(1)}')
        reqs.append(FieldRequirement(m.group(1), m.group(2) == "!=", m.group(3)))
    return reqs


def field_value(obj: dict[str, Any], path: str) -> str:
    node: Any = obj
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


def fields_match(reqs: list[FieldRequirement], obj: dict[str, Any]) -> bool:
    return all((field_value(obj, r.path) == r.value) != r.negate for r in reqs)
