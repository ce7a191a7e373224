"""Objects and expectations shared by the conformance suite."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
ISVCS = "/apis/specfleet.io/v1alpha1/namespaces/default/inferenceservices"
SERVICES = "/api/v1/namespaces/default/services"
SECRETS = "/api/v1/namespaces/default/secrets"
PDBS = "/apis/policy/v1/namespaces/default/poddisruptionbudgets"
NETPOLS = "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies"
METHOD_NOT_ALLOWED = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                      "message": "the server does not allow this method on the requested resource",
                      "reason": "MethodNotAllowed", "code": 405}


def project_crd() -> dict[str, Any]:
    """The InferenceService CRD the project ships (crds/inferenceservice.yaml)."""
    return yaml.safe_load((ROOT / "crds" / "inferenceservice.yaml").read_text())


def isvc(name: str = "s1", **spec: Any) -> dict[str, Any]:
    body = {"model": {"name": "smollm2", "source": "builtin:smollm2-135m"},
            "slo": {"ttftP99Ms": 500, "itlP99Ms": 50}, **spec}
    return {"apiVersion": "specfleet.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": name},
            "spec": body}


def crd_with(schema: dict[str, Any], name: str = "gadgets") -> dict[str, Any]:
    """A minimal CRD around one version schema (to probe what the server accepts in a schema)."""
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{name}.example.specfleet.io"},
            "spec": {"group": "example.specfleet.io", "scope": "Namespaced",
                     "names": {"plural": name, "singular": name[:-1], "kind": name[:-1].capitalize()},
                     "versions": [{"name": "v1", "served": True, "storage": True,
                                   "schema": {"openAPIV3Schema": schema}}]}}


def spec_schema(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": {"spec": {"type": "object", "properties": properties}}}


def causes(body: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(c.get("field", ""), c["reason"], c["message"]) for c in body["details"]["causes"]]


def deployment(name: str = "web", **spec: Any) -> dict[str, Any]:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "app", "image": "nginx"}]}}, **spec}}


def service(name: str = "web", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"selector": {"app": name}, "ports": [{"port": 80, "targetPort": 8000}], **spec}}


def pdb(name: str = "web", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": name}}, **spec}}


def network_policy(name: str = "web", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": name},
            "spec": {"podSelector": {"matchLabels": {"app": name}}, "policyTypes": ["Ingress"],
                     "ingress": [{"ports": [{"port": 8000, "protocol": "TCP"}]}], **spec}}


def secret(name: str = "token", **fields: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "type": "Opaque",
            "data": {"token": "c2VjcmV0"}, **fields}
