"""`ApiClient`: the few Kubernetes verbs the node agent, the gateway and `specfleet up` need, over aiohttp.

Plain dicts in and out, merge patches only; a 404 on get is None, any other error is `ApiCallError`
(`forbidden` on a 403: RBAC refused it, and the message names the user, verb, resource and namespace).
`watch` follows one kind as a stream of (type, object) events, the way an informer does.
"""
from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import aiohttp

log = logging.getLogger("specfleet.api_client")
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


class ApiCallError(Exception):
    """The API server answered an error status (`status`, and its `message`)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message

    @property
    def forbidden(self) -> bool:
        return self.status == 403


def path(kind: str, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
    prefix, plural, namespaced = RESOURCES[kind]
    url = prefix + (f"/namespaces/{namespace}" if namespaced and namespace else "") + f"/{plural}"
    return url + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


@dataclass
class ApiClient:
    """An aiohttp client for one API server (create it inside a running event loop)."""

    url: str
    user_agent: str = "specfleet-node-agent"
    session: aiohttp.ClientSession | None = None
    token: str | None = None                   # a bearer token (a service account's), for a real cluster
    ssl_context: ssl.SSLContext | None = None  # the cluster's CA / client certificate

    async def __aenter__(self) -> "ApiClient":
        headers = {"User-Agent": self.user_agent}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        connector = aiohttp.TCPConnector(ssl=self.ssl_context) if self.ssl_context is not None else None
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30), headers=headers,
                                             connector=connector)
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
                raise ApiCallError(response.status, _message(text))
            return json.loads(text) if text else None

    async def list_with_version(self, kind: str, namespace: str | None = None,
                                selector: str | None = None, fields: str | None = None) -> tuple[list[dict], str]:
        """The items and the list's resourceVersion (where a watch resumes)."""
        params = {k: v for k, v in (("labelSelector", selector), ("fieldSelector", fields)) if v} or None
        result = await self._call("GET", path(kind, namespace), params=params) or {}
        return result.get("items", []), (result.get("metadata") or {}).get("resourceVersion", "")

    async def list(self, kind: str, namespace: str | None = None, selector: str | None = None) -> list[dict]:
        return (await self.list_with_version(kind, namespace, selector))[0]

    async def get(self, kind: str, namespace: str | None, name: str) -> dict | None:
        return await self._call("GET", path(kind, namespace, name))

    async def create(self, obj: dict) -> dict:
        meta = obj.get("metadata", {})
        return await self._call("POST", path(obj["kind"], meta.get("namespace")), obj)

    async def patch(self, kind: str, namespace: str | None, name: str, patch: dict,
                    sub: str | None = None) -> dict:
        return await self._call("PATCH", path(kind, namespace, name, sub), patch, MERGE)

    async def bind(self, namespace: str, pod: str, node: str, uid: str | None = None) -> None:
        """Assign a pod to a node through `pods/binding`, as a scheduler does on a cluster (`uid`: only that
        incarnation of the pod)."""
        meta = {"name": pod, "namespace": namespace, **({"uid": uid} if uid else {})}
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
                   "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        await self._call("POST", path("Pod", namespace, pod, "binding"), binding)

    async def delete(self, kind: str, namespace: str | None, name: str, grace_period_s: int | None = None,
                     uid: str | None = None) -> None:
        """DELETE, a missing object being fine. `grace_period_s` overrides a pod's grace period (0: at once);
        `uid` deletes only that incarnation (a 409 for another one with the same name is left alone)."""
        options: dict = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace_period_s is not None:
            options["gracePeriodSeconds"] = grace_period_s
        if uid:
            options["preconditions"] = {"uid": uid}
        try:
            await self._call("DELETE", path(kind, namespace, name), options)
        except ApiCallError as exc:
            if exc.status not in ((404, 409) if uid else (404,)):
                raise

    async def watch(self, kind: str, resource_version: str, timeout_s: int = 300, namespace: str | None = None,
                    fields: str | None = None) -> AsyncIterator[tuple[str, dict]]:
        """(ADDED | MODIFIED | DELETED, object) events after `resource_version` until the server ends the
        stream; an ERROR event (410 Gone: the version is too old) raises `ApiCallError`."""
        params = {"watch": "true", "resourceVersion": resource_version, "timeoutSeconds": str(timeout_s),
                  "allowWatchBookmarks": "true", **({"fieldSelector": fields} if fields else {})}
        timeout = aiohttp.ClientTimeout(total=None, sock_read=timeout_s + 30)
        async with self.session.get(self.url + path(kind, namespace), params=params, timeout=timeout) as response:
            if response.status >= 400:
                raise ApiCallError(response.status, _message(await response.text()))
            async for line in response.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                if event["type"] == "ERROR":
                    status = event.get("object") or {}
                    raise ApiCallError(status.get("code", 500), status.get("message", "watch failed"))
                yield event["type"], event["object"]


def _message(text: str) -> str:
    try:
        return json.loads(text).get("message", text)
    except (ValueError, AttributeError):
        return text


@dataclass
class Informer:
    """A local copy of every object of one kind, kept current by list-then-watch (re-listing when the
    watch ends or fails); `on_change` runs after each change, with the copy already updated. `namespace`
    and `fields` (a field selector) narrow what is followed, so RBAC can grant exactly that."""

    api: ApiClient
    kind: str
    objects: dict[tuple[str, str], dict] = field(default_factory=dict)
    retry_s: float = 0.5
    namespace: str | None = None
    fields: str | None = None
    forbidden_retry_s: float = 60.0           # RBAC refused the list or watch: it may be granted later

    async def run(self, on_change: Callable[[], None]) -> None:
        while True:
            try:
                items, version = await self.api.list_with_version(self.kind, self.namespace, fields=self.fields)
                self.objects = {_key(obj): obj for obj in items}
                on_change()
                async for kind, obj in self.api.watch(self.kind, version, namespace=self.namespace,
                                                      fields=self.fields):
                    if kind == "DELETED":
                        self.objects.pop(_key(obj), None)
                    elif kind in ("ADDED", "MODIFIED"):
                        self.objects[_key(obj)] = obj
                    else:
                        continue      # BOOKMARK
                    on_change()
            except ApiCallError as exc:
                if not exc.forbidden:
                    log.debug("%s watch: %s; listing again", self.kind, exc)
                    await asyncio.sleep(self.retry_s)
                    continue
                log.warning("missing RBAC permission: %s; following the rest, trying again in %.0f s", exc.message,
                            self.forbidden_retry_s)
                await asyncio.sleep(self.forbidden_retry_s)
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
                log.debug("%s watch: %s; listing again", self.kind, exc)
                await asyncio.sleep(self.retry_s)

    def items(self) -> list[dict]:
        return list(self.objects.values())


def _key(obj: dict) -> tuple[str, str]:
    meta = obj["metadata"]
    return meta.get("namespace") or "", meta["name"]
