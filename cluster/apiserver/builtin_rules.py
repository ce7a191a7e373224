"""The semantic checks kube-apiserver makes on the built-in kinds the operator writes, beyond types.

Only the rules an operator's rendering can break: a Deployment's selector must be set and match its
template's labels and have at least one named container (a template's `image` is optional: workload
controllers' config management may fill it in), Service ports lie in 1..65535, and a
PodDisruptionBudget sets minAvailable or maxUnavailable, not both. Wording as the real validation's.
"""
from __future__ import annotations

from typing import Any, Callable

from specfleet.cluster.apiserver.errors import Cause
from specfleet.cluster.apiserver.selectors import selector_from_match_labels


def required(field: str) -> Cause:
    return Cause("FieldValueRequired", "Required value", field)


def go_map(labels: dict[str, Any]) -> str:
    return "map[string]string{" + ", ".join(f'"{k}":"{v}"' for k, v in sorted(labels.items())) + "}"


def selector_causes(selector: dict[str, Any], labels: dict[str, Any]) -> list[Cause]:
    try:
        reqs = selector_from_match_labels(selector)
    except (KeyError, TypeError):
        return [Cause("FieldValueInvalid", "Invalid value: not a valid label selector operator", "spec.selector")]
    if all(r.matches({k: str(v) for k, v in labels.items()}) for r in reqs):
        return []
    return [Cause("FieldValueInvalid", f"Invalid value: {go_map(labels)}: `selector` does not match template `labels`",
                  "spec.template.metadata.labels")]


def container_causes(containers: Any, field: str) -> list[Cause]:
    out = []
    if not containers:
        return [required(field)]
    for i, container in enumerate(containers or []):
        if not (container or {}).get("name"):
            out.append(required(f"{field}[{i}].name"))
    return out


def deployment_causes(obj: dict[str, Any]) -> list[Cause]:
    spec = obj.get("spec") or {}
    template = spec.get("template") or {}
    labels = (template.get("metadata") or {}).get("labels") or {}
    out = []
    selector = spec.get("selector")
    if not selector:
        out.append(required("spec.selector"))
    else:
        out += selector_causes(selector, labels)
    return out + container_causes((template.get("spec") or {}).get("containers"), "spec.template.spec.containers")


def service_causes(obj: dict[str, Any]) -> list[Cause]:
    out = []
    for i, port in enumerate((obj.get("spec") or {}).get("ports") or []):
        number = (port or {}).get("port")
        if not isinstance(number, int) or not 1 <= number <= 65535:
            out.append(Cause("FieldValueInvalid", f"Invalid value: {number}: must be between 1 and 65535, inclusive",
                             f"spec.ports[{i}].port"))
    return out


def pdb_causes(obj: dict[str, Any]) -> list[Cause]:
    spec = obj.get("spec") or {}
    if spec.get("minAvailable") is not None and spec.get("maxUnavailable") is not None:
        return [Cause("FieldValueInvalid", "Invalid value: minAvailable and maxUnavailable cannot be both set",
                      "spec")]
    return []


RULES: dict[str, Callable[[dict[str, Any]], list[Cause]]] = {
    "apps/deployments": deployment_causes, "/services": service_causes,
    "policy/poddisruptionbudgets": pdb_causes,
}


def causes(rt: Any, obj: dict[str, Any]) -> list[Cause]:
    rule = RULES.get(rt.key)
    return rule(obj) if rule else []
