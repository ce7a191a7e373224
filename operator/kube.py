"""The operator's one Kubernetes interface: read, create-or-correct, scale, annotate and the status
patch, on plain dicts. The handlers and the control loop make every API call through `Kube`.

Uses the `kubernetes` client with raw JSON in and out (no model classes), so what the renderer returns
is exactly what is sent and compared. `apply` writes only when the live object drifted from the
desired one (`is_subset`), which keeps reconciliation idempotent and cheap.

A `403` is not transient (`transient` says no) but may be fixed at any time by an RBAC change: `forbidden`
gives its Status message, which names the user, verb, resource and namespace, for the handlers to report
and retry every `FORBIDDEN_RETRY_S`.

Every call has a timeout (`SPECFLEET_API_TIMEOUT` seconds, default 30): the client's default is none,
so a hung API server would block a handler (and its worker thread) forever instead of failing it into
kopf's retry.

Responses the operator does not read are drained (`_release`), so their connections go back to the
pool; the pool holds as many connections as there are threads that call it (`connection_pool_size`): kopf's
handler workers, asyncio's default executor (`asyncio.to_thread`) and the control loop's (`threads.py`). The
client's own default, five per CPU, is 10 on two CPUs; with more callers than that, every call beyond it
opened a new TCP connection and threw it away afterwards.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Callable

from specfleet.operator.api import GROUP, PLURAL, VERSION
from specfleet.operator.threads import CONTROL_THREADS

MERGE = "application/merge-patch+json"
EVENT_SOURCE = "specfleet-operator"
DEFAULT_TIMEOUT_S = 30.0
FORBIDDEN_RETRY_S = 60.0
UNREAD = object()               # `Kube.apply`: the caller has not read the live object
HANDLER_WORKERS = 16            # kopf's `settings.execution.max_workers` (handlers.configure)


def connection_pool_size(workers: int = HANDLER_WORKERS, cpus: int | None = None) -> int:
    """Connections to keep to the API server: one per thread that may call it at once, kopf's `workers`,
    asyncio's default executor (min(32, CPUs + 4) threads) and the control loop's `CONTROL_THREADS`."""
    return workers + min(32, (cpus or os.cpu_count() or 1) + 4) + CONTROL_THREADS


def request_timeout() -> float:
    return float(os.environ.get("SPECFLEET_API_TIMEOUT", DEFAULT_TIMEOUT_S))


def is_subset(desired: Any, actual: Any) -> bool:
    """True when every field of `desired` is present and equal in `actual` (server defaults ignored)."""
    if isinstance(desired, dict):
        return isinstance(actual, dict) and all(k in actual and is_subset(v, actual[k]) for k, v in desired.items())
    if isinstance(desired, list):
        return (isinstance(actual, list) and len(desired) == len(actual)
                and all(is_subset(d, a) for d, a in zip(desired, actual)))
    if isinstance(desired, (int, float)) and isinstance(actual, (int, float)) and not isinstance(desired, bool):
        return desired == actual
    return desired == actual


@dataclass
class _Verbs:
    read: Callable
    create: Callable
    patch: Callable
    delete: Callable


class Kube:
    """Just the verbs the operator needs, over a kubernetes.client.ApiClient."""

    def __init__(self, api_client, timeout: float | None = None):
        from kubernetes import client

        self.client = client
        _default_timeout(api_client, timeout if timeout is not None else request_timeout())
        self.apps = client.AppsV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.policy = client.PolicyV1Api(api_client)
        self.networking = client.NetworkingV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.verbs = {
            "Deployment": _Verbs(self.apps.read_namespaced_deployment, self.apps.create_namespaced_deployment,
                                 self.apps.patch_namespaced_deployment, self.apps.delete_namespaced_deployment),
            "Service": _Verbs(self.core.read_namespaced_service, self.core.create_namespaced_service,
                              self.core.patch_namespaced_service, self.core.delete_namespaced_service),
            "PodDisruptionBudget": _Verbs(self.policy.read_namespaced_pod_disruption_budget,
                                          self.policy.create_namespaced_pod_disruption_budget,
                                          self.policy.patch_namespaced_pod_disruption_budget,
                                          self.policy.delete_namespaced_pod_disruption_budget),
            "NetworkPolicy": _Verbs(self.networking.read_namespaced_network_policy,
                                    self.networking.create_namespaced_network_policy,
                                    self.networking.patch_namespaced_network_policy,
                                    self.networking.delete_namespaced_network_policy),
            "Pod": _Verbs(self.core.read_namespaced_pod, self.core.create_namespaced_pod,
                          self.core.patch_namespaced_pod, self.core.delete_namespaced_pod),
            "Secret": _Verbs(self.core.read_namespaced_secret, self.core.create_namespaced_secret,
                             self.core.patch_namespaced_secret, self.core.delete_namespaced_secret),
        }

    def transient(self, exc: BaseException) -> bool:
        """An API error worth retrying later: a timeout, a dropped connection, 409/429/5xx."""
        import urllib3

        if isinstance(exc, self.client.ApiException):
            return exc.status in (0, 409, 429) or (exc.status or 0) >= 500
        return isinstance(exc, (urllib3.exceptions.HTTPError, OSError))

    def forbidden(self, exc: BaseException) -> str | None:
        """The server's message for a 403 (`deployments.apps "x" is forbidden: User "..." cannot patch ...`)."""
        if not isinstance(exc, self.client.ApiException) or exc.status != 403:
            return None
        try:
            return json.loads(exc.body or "{}").get("message") or "Forbidden"
        except (TypeError, ValueError, AttributeError):
            return str(exc.body or exc.reason or "Forbidden")

    @classmethod
    def from_environment(cls) -> "Kube":
        """In-cluster service account if present, else KUBECONFIG / ~/.kube/config."""
        from kubernetes import client, config

        configuration = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException:
            config.load_kube_config(client_configuration=configuration)
        configuration.connection_pool_maxsize = connection_pool_size()
        return cls(client.ApiClient(configuration))

    def get(self, kind: str, namespace: str, name: str) -> dict | None:
        try:
            response = self.verbs[kind].read(name, namespace, _preload_content=False)
        except self.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return json.loads(response.data)

    def apply(self, manifest: dict, live: dict | None | object = UNREAD) -> str:
        """Create, or merge-patch when drifted; returns "created" | "updated" | "unchanged".

        `live` is the object as the caller last read it, which saves reading it again; `None` says the caller
        believes it absent, so it is created at once (a 409 means it exists after all: read it and compare)."""
        kind, meta = manifest["kind"], manifest["metadata"]
        if live is UNREAD:
            live = self.get(kind, meta["namespace"], meta["name"])
        if live is None:
            if self._create(manifest):
                return "created"
            live = self.get(kind, meta["namespace"], meta["name"]) or {}
        if is_subset(manifest, live):
            return "unchanged"
        _release(self.verbs[kind].patch(meta["name"], meta["namespace"], manifest, _content_type=MERGE,
                                        _preload_content=False))
        return "updated"

    def create_if_missing(self, manifest: dict, live: dict | None | object = UNREAD) -> bool:
        """Create an object unless one of that name exists (never overwrites); True when created. `live` as
        for `apply`: unread, it is read first, so a steady-state reconcile sends no doomed create."""
        meta = manifest["metadata"]
        if live is UNREAD:
            live = self.get(manifest["kind"], meta["namespace"], meta["name"])
        return live is None and self._create(manifest)

    def _create(self, manifest: dict) -> bool:
        """Create `manifest`; False when an object of that name already exists (409)."""
        try:
            _release(self.verbs[manifest["kind"]].create(manifest["metadata"]["namespace"], manifest,
                                                         _preload_content=False))
        except self.client.ApiException as exc:
            if exc.status != 409:
                raise
            return False
        return True

    def scale(self, kind: str, namespace: str, name: str, replicas: int) -> None:
        """Set `spec.replicas` (the control loop's decision; never the CR's spec)."""
        _release(self.verbs[kind].patch(name, namespace, {"spec": {"replicas": replicas}}, _content_type=MERGE,
                                        _preload_content=False))

    def annotate(self, kind: str, namespace: str, name: str, annotations: dict[str, str]) -> None:
        _release(self.verbs[kind].patch(name, namespace, {"metadata": {"annotations": annotations}},
                                        _content_type=MERGE, _preload_content=False))

    def post_event(self, regarding: dict, type_: str, reason: str, message: str, now: str) -> None:
        """A core/v1 Event about `regarding` (an object with apiVersion, kind and metadata)."""
        meta = regarding["metadata"]
        event = {"apiVersion": "v1", "kind": "Event",
                 "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
                 "involvedObject": {"apiVersion": regarding.get("apiVersion"), "kind": regarding.get("kind"),
                                    "name": meta["name"], "namespace": meta["namespace"], "uid": meta.get("uid")},
                 "type": type_, "reason": reason, "message": message, "count": 1,
                 "firstTimestamp": now, "lastTimestamp": now, "source": {"component": EVENT_SOURCE}}
        _release(self.core.create_namespaced_event(meta["namespace"], event, _preload_content=False))

    def get_service(self, namespace: str, name: str) -> dict | None:
        """The InferenceService object, or None when it is gone."""
        try:
            response = self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                                                _preload_content=False)
        except self.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return json.loads(response.data)

    def patch_service_status(self, namespace: str, name: str, status: dict, resource_version: str | None = None
                             ) -> None:
        """Merge `status` into the InferenceService's status (the operator's only status write:
        `handlers.publish` is its one caller). With `resource_version`, only onto that version of the object
        (else a 409 Conflict, `conflict`): the patch was made from it."""
        body: dict = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        _release(self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name, body,
                                                                   _content_type=MERGE, _preload_content=False))

    def conflict(self, exc: BaseException) -> bool:
        """A 409: the object changed since the version a write named."""
        return isinstance(exc, self.client.ApiException) and exc.status == 409


def _release(response) -> None:
    """Read a response nobody needs to its end, so its connection goes back to the pool: one left unread
    is closed when collected, and the next call opens a new TCP connection."""
    response.drain_conn()
    response.release_conn()


def _default_timeout(api_client, seconds: float) -> None:
    """Give every request of `api_client` a timeout unless the caller set one."""
    rest = api_client.rest_client
    if getattr(rest, "_specfleet_timeout", None) is not None:
        rest._specfleet_timeout = seconds
        return
    request = rest.request

    def with_timeout(*args, _request_timeout=None, **kwargs):
        return request(*args, _request_timeout=_request_timeout or rest._specfleet_timeout, **kwargs)

    rest._specfleet_timeout = seconds
    rest.request = with_timeout
