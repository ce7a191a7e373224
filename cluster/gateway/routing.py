"""Which pod takes a request: routes from the API's objects, and the balancer that picks among them.

Routing: the request's `model` names an InferenceService (`spec.model.name`); its Service's selector
picks the Pods, and only Ready ones (no deletionTimestamp) take traffic, each at `status.podIP` and the
container port the Service's `targetPort` names, as a cluster's Service would route.

Balancing: the pod with the fewest prompts waiting for prefill, then the fewest outstanding requests,
preferring the pod a prompt prefix hashes to (rendezvous hashing) while it is within `AFFINITY_SLACK`
of the shortest queue and of the least outstanding requests, so repeated prefixes land where their KV
blocks are cached. Waiting = the engine's `vllm:num_requests_waiting` at the last poll plus the
requests sent to it since (an endpoint picker's queue-depth scorer). Balancing by outstanding requests
alone hands a pod that just became ready every arrival until it holds as many as the others, and the
prompts pile up in its prefill queue.

LoRA adapters (`adapters`): a `model` naming an adapter goes to that adapter's service, and among its pods
to those that serve the adapter (then as above). While none does, `pick` finds nothing (the gateway
waits for the operator to load it) unless `strict` is off (then any pod, by load). Nothing here does I/O.
"""
from __future__ import annotations

import hashlib
import json
import random
import time
from dataclasses import dataclass, field

from specfleet.cluster.gateway.adapters import adapter_routes, declared_adapters

AFFINITY_SLACK = 2
PREFIX_CHARS = 256
EJECT_S = 3.0


@dataclass
class Endpoint:
    pod: str
    url: str


@dataclass
class Route:
    namespace: str
    service: str
    model: str
    endpoints: list[Endpoint] = field(default_factory=list)
    adapters: tuple[str, ...] = ()                 # declared in spec.adapters

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.service}"


def prefix_key(body: dict) -> str | None:
    """The start of the prompt (or the rendered messages) that prefix affinity hashes."""
    if isinstance(body.get("messages"), list):
        text = "".join(f"{m.get('role')}:{m.get('content')}\n" for m in body["messages"] if isinstance(m, dict))
    elif body.get("prompt") is not None:
        text = json.dumps(body["prompt"]) if not isinstance(body["prompt"], str) else body["prompt"]
    else:
        return None
    return text[:PREFIX_CHARS]


def endpoint_url(pod: dict, target_port) -> str | None:
    """`http://podIP:port` for the Service's target port (a container port's name or number; None: the
    first); None while the pod has no IP or no such port."""
    ip = (pod.get("status") or {}).get("podIP")
    if isinstance(target_port, str) and target_port.isdigit():
        target_port = int(target_port)
    for container in pod["spec"].get("containers") or []:
        for port in container.get("ports") or []:
            if target_port in (port.get("name"), port.get("containerPort"), None):
                return f"http://{ip}:{port['containerPort']}" if ip else None
    return None


def _ready(pod: dict) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _matches(labels: dict, selector: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def routes_from(services: list[dict], k8s_services: list[dict], pods: list[dict]) -> dict[str, Route]:
    """model name -> Route with the ready endpoints, from InferenceServices, Services and Pods. A service
    with no ready pod still has its route (empty): its requests are held, not refused. A PlanOnly service
    creates nothing, so holding would only wait out the timeout: it has a route only while pods of an
    earlier Serving generation are ready."""
    svc_index = {(s["metadata"]["namespace"], s["metadata"]["name"]): s for s in k8s_services}
    routes: dict[str, Route] = {}
    for isvc in sorted(services, key=lambda s: (s["metadata"]["namespace"], s["metadata"]["name"])):
        meta = isvc["metadata"]
        model = ((isvc.get("spec") or {}).get("model") or {}).get("name") or meta["name"]
        route = Route(meta["namespace"], meta["name"], model, adapters=declared_adapters(isvc))
        svc = svc_index.get((meta["namespace"], meta["name"]))
        if svc is not None:
            selector = svc["spec"].get("selector") or {}
            target = ((svc["spec"].get("ports") or [{}])[0]).get("targetPort")
            for pod in pods:
                if (pod["metadata"].get("namespace") == meta["namespace"] and _ready(pod)
                        and _matches(pod["metadata"].get("labels") or {}, selector)):
                    url = endpoint_url(pod, target)
                    if url:
                        route.endpoints.append(Endpoint(pod["metadata"]["name"], url))
        if (isvc.get("spec") or {}).get("mode") == "PlanOnly" and not route.endpoints:
            continue
        routes.setdefault(model, route)
    return routes


@dataclass
class Balancer:
    """The routes and what the gateway knows of each pod's load."""

    routes: dict[str, Route] = field(default_factory=dict)
    outstanding: dict[str, int] = field(default_factory=dict)
    waiting: dict[str, float] = field(default_factory=dict)   # engine's waiting gauge at the last poll
    sent: dict[str, int] = field(default_factory=dict)        # requests sent since that poll
    ejected: dict[str, float] = field(default_factory=dict)   # url -> monotonic time it may return
    served: dict[str, frozenset[str]] = field(default_factory=dict)   # url -> adapters it serves (last poll)
    _index: tuple = field(default=(None, None, None), init=False, repr=False, compare=False)   # resolve's cache

    def resolve(self, model: str) -> tuple[Route, str | None] | None:
        """The route of a request's `model` and the adapter it names (None: the base model); None: unknown."""
        if model in self.routes:
            return self.routes[model], None
        index = self.adapters()
        return (index[model], model) if model in index else None

    def adapters(self) -> dict[str, Route]:
        """adapter name -> its route (`adapters.adapter_routes`), recomputed when routes or `served` change."""
        routes, served, index = self._index
        if routes is not self.routes or served is not self.served:
            index = adapter_routes(self.routes, self.served)
            self._index = (self.routes, self.served, index)
        return index

    def pick(self, model: str, key: str | None, exclude: set[str], adapter: str | None = None,
             strict: bool = True) -> Endpoint | None:
        """A pod of `model`'s route; with `adapter`, one serving it (or, not `strict`, any when none does)."""
        now = time.monotonic()
        route = self.routes.get(model)
        candidates = [e for e in (route.endpoints if route else [])
                      if e.url not in exclude and self.ejected.get(e.url, 0) <= now]
        if adapter is not None:
            holding = [e for e in candidates if adapter in self.served.get(e.url, ())]
            candidates = holding if holding or strict else candidates
        if not candidates:
            return None
        queued = {e.url: self.waiting.get(e.url, 0.0) + self.sent.get(e.url, 0) for e in candidates}
        load = {e.url: self.outstanding.get(e.url, 0) for e in candidates}
        shortest, least = min(queued.values()), min(load.values())
        if key is not None:
            preferred = max(candidates, key=lambda e: hashlib.sha1(f"{key}|{e.url}".encode()).digest())
            if queued[preferred.url] <= shortest + AFFINITY_SLACK and load[preferred.url] <= least + AFFINITY_SLACK:
                return preferred
        candidates = [e for e in candidates if queued[e.url] <= shortest]
        least = min(load[e.url] for e in candidates)
        return random.choice([e for e in candidates if load[e.url] == least])

    def started(self, url: str) -> None:
        self.outstanding[url] = self.outstanding.get(url, 0) + 1
        self.sent[url] = self.sent.get(url, 0) + 1

    def finished(self, url: str) -> None:
        self.outstanding[url] = self.outstanding.get(url, 1) - 1

    def forget(self, url: str, adapter: str) -> None:
        """The pod answered that it lacks `adapter`: stop preferring it until a poll says otherwise."""
        self.served = {**self.served, url: self.served.get(url, frozenset()) - {adapter}}

    def eject(self, url: str, seconds: float = EJECT_S) -> None:
        self.ejected[url] = time.monotonic() + seconds

    def urls(self) -> set[str]:
        return {e.url for route in self.routes.values() for e in route.endpoints}
