"""Fixtures for the API emulator tests: a running emulator, a tiny HTTP client, the test CRD."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from specfleet.cluster.apiserver import running_apiserver

MANIFESTS = Path(__file__).parent / "manifests"
WIDGETS = "/apis/example.specfleet.io/v1/namespaces/default/widgets"
DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"
CONFIGMAPS = "/api/v1/namespaces/default/configmaps"


def manifest(name: str) -> dict[str, Any]:
    return yaml.safe_load((MANIFESTS / name).read_text())


@dataclass
class Http:
    """A thin JSON client for the emulator: returns (status code, body)."""
    url: str

    def call(self, method: str, path: str, body: Any = None, ctype: str = "application/json",
             headers: dict[str, str] | None = None, **params: Any) -> tuple[int, Any]:
        data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
        r = requests.request(method, self.url + path, data=data, params=params or None, timeout=10,
                             headers={"Content-Type": ctype, **(headers or {})})
        return r.status_code, (r.json() if r.content else None)

    def get(self, path: str, **kw: Any) -> tuple[int, Any]:
        return self.call("GET", path, **kw)

    def post(self, path: str, body: Any, **kw: Any) -> tuple[int, Any]:
        return self.call("POST", path, body, **kw)

    def put(self, path: str, body: Any, **kw: Any) -> tuple[int, Any]:
        return self.call("PUT", path, body, **kw)

    def patch(self, path: str, body: Any, kind: str = "merge", **kw: Any) -> tuple[int, Any]:
        ctype = {"merge": "application/merge-patch+json", "json": "application/json-patch+json",
                 "strategic": "application/strategic-merge-patch+json",
                 "apply": "application/apply-patch+yaml"}[kind]
        return self.call("PATCH", path, body, ctype=ctype, **kw)

    def delete(self, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        return self.call("DELETE", path, body, **kw)

    def ok(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        code, out = getattr(self, method)(path, body, **kw) if body is not None else getattr(self, method)(path, **kw)
        assert code < 300, (code, out)
        return out


@pytest.fixture
def api(tmp_path: Path):
    with running_apiserver(tmp_path / "kubeconfig", bookmark_interval=0.3, history_size=1000) as server:
        yield server


@pytest.fixture
def http(api) -> Http:
    return Http(api.url)


@pytest.fixture
def crd(http: Http) -> dict[str, Any]:
    return http.ok("post", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", manifest("crd.yaml"))


def widget(name: str = "w1", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "example.specfleet.io/v1", "kind": "Widget", "metadata": {"name": name},
            "spec": {"size": "small", **spec}}


def configmap(name: str, labels: dict[str, str] | None = None, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels or {}},
            "data": data}
