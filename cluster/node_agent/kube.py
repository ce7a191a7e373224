"""The few Kubernetes verbs the node agent, the gateway and `specfleet up` need, over aiohttp and raw JSON.

Plain dicts in and out, merge patches only; a 404 on get is None, any other error is `KubeError`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import yaml

MERGE = "application/merge-patch+json"

# kind -> (API prefix, plural, namespaced)
RESOURCES = {
    "Namespace": ("/api/v1", "namespaces", False),
    "Node": ("/api/v1", "nodes", False),
    "Pod": ("/api/v1", "pods", True),
    "Service": ("/api/v1", "services", True),
    "Secret": ("/api/v1", "secrets", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "Event": ("/api/v1", "events", True),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "ReplicaSet": ("/apis/apps/v1", "replicasets", True),
    "CustomResourceDefinition": ("/apis/apiextensions.k8s.io/v1", "customresourcedefinitions", False),
    "InferenceService": ("/apis/specfleet.io/v1alpha1", "inferenceservices", True),
}


class KubeError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


def server_url(kubeconfig: str | Path) -> str:
    """The API server URL of a kubeconfig's current context."""
    config = yaml.safe_load(Path(kubeconfig).read_text())
    context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
    return next(c["cluster"]["server"] for c in config["clusters"] if c["name"] == context["cluster"])


def path(kind: str, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
    prefix, plural, namespaced = RESOURCES[kind]
    url = prefix + (f"/namespaces/{namespace}" if namespaced and namespace else "") + f"/{plural}"
    return url + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


@dataclass
class Kube:
    """An aiohttp client for one API server (create it inside a running event loop)."""

    url: str
    session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> "Kube":
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30),
                                             headers={"User-Agent": "specfleet-node-agent"})
        return self

    async def __aexit__(self, *exc) -> None:
        await self.session.close()

    async def _call(self, method: str, url: str, body=None, content_type: str = "application/json",
                    params: dict | None = None) -> dict | None:
        data = None if body is None else json.dumps(body)
        async with self.session.request(method, self.url + url, data=data, params=params,
                                        headers={"Content-Type": content_type}) as response:
            text = await response.text()
            if response.status == 404 and method == "GET":
                return None
            if response.status >= 400:
                try:
                    message = json.loads(text).get("message", text)
                except ValueError:
                    message = text
                raise KubeError(response.status, message)
            return json.loads(text) if text else None

    async def list(self, kind: str, namespace: str | None = None, selector: str | None = None) -> list[dict]:
        params = {"labelSelector": selector} if selector else None
        result = await self._call("GET", path(kind, namespace), params=params)
        return (result or {}).get("items", [])

    async def get(self, kind: str, namespace: str | None, name: str) -> dict | None:
        return await self._call("GET", path(kind, namespace, name))

    async def create(self, obj: dict) -> dict:
        meta = obj.get("metadata", {})
        return await self._call("POST", path(obj["kind"], meta.get("namespace")), obj)

    async def patch(self, kind: str, namespace: str | None, name: str, patch: dict,
                    sub: str | None = None) -> dict:
        return await self._call("PATCH", path(kind, namespace, name, sub), patch, MERGE)

    async def delete(self, kind: str, namespace: str | None, name: str) -> None:
        try:
            await self._call("DELETE", path(kind, namespace, name))
        except KubeError as exc:
            if exc.status != 404:
                raise
