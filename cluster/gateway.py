"""The local gateway: one OpenAI-compatible endpoint in front of the ready pods of every InferenceService.

Routing: the request's `model` names an InferenceService (`spec.model.name`); its Service's selector
picks the Pods, and only Ready ones (no deletionTimestamp) take traffic. Among them the gateway picks
the pod with the fewest prompts waiting for prefill, then the fewest outstanding requests, preferring
the pod a prompt prefix hashes to (rendezvous hashing) while it is within `AFFINITY_SLACK` of the
shortest queue and of the least outstanding requests, so repeated prefixes land where their KV blocks
are cached. Waiting = the engine's `vllm:num_requests_waiting`, polled every `QUEUE_POLL_S`,
plus the requests sent to it since (an endpoint picker's queue-depth scorer). Balancing by outstanding
requests alone hands a pod that just became ready every arrival until it holds as many as the others,
and the prompts pile up in its prefill queue.

Failures: a connection error, a reset, or a 429/502/503/504 before the first byte reached the client is
retried on another pod (up to `MAX_ATTEMPTS`, waiting up to `WAIT_READY_S` for a ready pod), and the
failing pod is ejected for a moment. Non-streaming answers are forwarded only once complete, so a pod
that dies mid-answer costs a retry, not the request; streams start only once the first chunk arrived.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import time
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from specfleet.cluster.node_agent.kube import Kube, KubeError

log = logging.getLogger("specfleet.gateway")
AFFINITY_SLACK = 2
PREFIX_CHARS = 256
MAX_ATTEMPTS = 4
WAIT_READY_S = 60.0
EJECT_S = 3.0
RETRY_STATUS = {429, 502, 503, 504}
QUEUE_POLL_S = 0.25
WAITING_METRIC = "vllm:num_requests_waiting"


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


class NoEndpoint(Exception):
    pass


def openai_error(status: int, message: str, kind: str, code: str) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return web.json_response(body, status=status)


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
    annotation = (pod["metadata"].get("annotations") or {}).get("specfleet.io/endpoint")
    if annotation:
        return annotation
    ip = (pod.get("status") or {}).get("podIP")
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
    """model name -> Route with the ready endpoints, from InferenceServices, Services and Pods."""
    svc_index = {(s["metadata"]["namespace"], s["metadata"]["name"]): s for s in k8s_services}
    routes: dict[str, Route] = {}
    for isvc in services:
        meta = isvc["metadata"]
        model = ((isvc.get("spec") or {}).get("model") or {}).get("name") or meta["name"]
        route = Route(meta["namespace"], meta["name"], model)
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
        routes.setdefault(model, route)
    return routes


class Gateway:
    def __init__(self, api_url: str, host: str = "127.0.0.1", port: int = 8000, refresh_s: float = 0.5):
        self.api_url, self.host, self.port, self.refresh_s = api_url, host, port, refresh_s
        self.routes: dict[str, Route] = {}
        self.outstanding: dict[str, int] = {}
        self.waiting: dict[str, float] = {}      # engine's waiting gauge at the last poll
        self.sent: dict[str, int] = {}           # requests sent since that poll
        self.ejected: dict[str, float] = {}
        self.stats = {"requests": 0, "retries": 0, "failed": 0}
        self.changed = asyncio.Event()
        self.session: aiohttp.ClientSession | None = None
        self.runner: web.AppRunner | None = None

    # -- lifecycle ----------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/{tail:.*}", self.proxy)
        app.router.add_route("*", "/{tail:.*}", self.not_found)
        return app

    async def start(self) -> None:
        """Bind the port (raises OSError when taken) and start following the cluster."""
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=5,
                                                                           sock_read=600))
        self.runner = web.AppRunner(self.app(), access_log=None, handler_cancellation=True)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.host, self.port, reuse_address=True)
        await site.start()
        self._follow = asyncio.create_task(self._refresh_forever())
        self._poll = asyncio.create_task(self._poll_queues_forever())

    async def stop(self) -> None:
        self._follow.cancel()
        self._poll.cancel()
        await asyncio.gather(self._follow, self._poll, return_exceptions=True)
        await self.runner.cleanup()
        await self.session.close()

    async def _refresh_forever(self) -> None:
        async with Kube(self.api_url) as kube:
            while True:
                try:
                    services = await kube.list("InferenceService")
                    routes = routes_from(services, await kube.list("Service"), await kube.list("Pod"))
                    self.routes = routes
                    self.changed.set()
                    self.changed = asyncio.Event()
                except (KubeError, aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    log.debug("refresh failed: %s", exc)
                await asyncio.sleep(self.refresh_s)

    async def _poll_queues_forever(self) -> None:
        while True:
            urls = {e.url for route in self.routes.values() for e in route.endpoints}
            results = await asyncio.gather(*(self._waiting_of(url) for url in urls))
            self.waiting = {url: value for url, value in zip(urls, results) if value is not None}
            await asyncio.sleep(QUEUE_POLL_S)

    async def _waiting_of(self, url: str) -> float | None:
        """The engine's waiting gauge (None when it cannot be read: the pick then counts only what
        this gateway sent); the requests sent since count from this poll on."""
        sent = self.sent.pop(url, 0)
        try:
            async with self.session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=QUEUE_POLL_S * 4)) as r:
                text = await r.text() if r.status == 200 else ""
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError):
            text = ""
        values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(WAITING_METRIC)]
        if not values:
            self.sent[url] = self.sent.get(url, 0) + sent
            return None
        return sum(values)

    # -- routing ------------------------------------------------------------------------------------
    def pick(self, model: str, key: str | None, exclude: set[str]) -> Endpoint | None:
        now = time.monotonic()
        route = self.routes.get(model)
        candidates = [e for e in (route.endpoints if route else [])
                      if e.url not in exclude and self.ejected.get(e.url, 0) <= now]
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

    # -- handlers -----------------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "models": sorted(self.routes), "stats": self.stats})

    async def models(self, request: web.Request) -> web.Response:
        data = [{"id": model, "object": "model", "created": 0, "owned_by": "specfleet",
                 "specfleet": {"inferenceService": f"{r.namespace}/{r.service}", "readyReplicas": len(r.endpoints)}}
                for model, r in sorted(self.routes.items())]
        return web.json_response({"object": "list", "data": data})

    async def not_found(self, request: web.Request) -> web.Response:
        return openai_error(404, f"no route {request.method} {request.path}", "invalid_request_error", "not_found")

    async def proxy(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
            model = body["model"]
        except (ValueError, KeyError, TypeError):
            return openai_error(400, "the body must be JSON with a `model` field", "invalid_request_error",
                                "json_invalid")
        if model not in self.routes:
            return openai_error(404, f"the model `{model}` does not exist; see GET /v1/models",
                                "invalid_request_error", "model_not_found")
        self.stats["requests"] += 1
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        if "Authorization" in request.headers:
            headers["Authorization"] = request.headers["Authorization"]
        return await self._forward(request, request.path_qs, raw, headers, model, prefix_key(body),
                                   bool(body.get("stream")))

    async def _forward(self, request, path, raw, headers, model, key, stream) -> web.StreamResponse:
        tried: set[str] = set()
        deadline = time.monotonic() + WAIT_READY_S
        last: web.Response | None = None
        attempts = 0
        while attempts < MAX_ATTEMPTS:
            endpoint = self.pick(model, key, tried) or self.pick(model, key, set())
            if endpoint is None:
                if time.monotonic() >= deadline:
                    break
                await self._wait_change(deadline)
                continue
            attempts += 1
            if attempts > 1:
                self.stats["retries"] += 1
            self.outstanding[endpoint.url] = self.outstanding.get(endpoint.url, 0) + 1
            self.sent[endpoint.url] = self.sent.get(endpoint.url, 0) + 1
            try:
                result = await self._attempt(request, endpoint, path, raw, headers, stream)
            except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as exc:
                log.info("%s failed before the first byte (%s); retrying elsewhere", endpoint.pod, exc)
                self.ejected[endpoint.url] = time.monotonic() + EJECT_S
                tried.add(endpoint.url)
                last = openai_error(502, f"pod {endpoint.pod} failed: {exc}", "server_error", "upstream_failed")
                continue
            finally:
                self.outstanding[endpoint.url] -= 1
            if isinstance(result, web.Response) and result.status in RETRY_STATUS:
                tried.add(endpoint.url)
                last = result
                if result.status == 503:
                    self.ejected[endpoint.url] = time.monotonic() + EJECT_S
                continue
            return result
        self.stats["failed"] += 1
        return last or openai_error(503, f"no ready replica of `{model}` within {WAIT_READY_S:g} s",
                                    "service_unavailable", "no_ready_replicas")

    async def _wait_change(self, deadline: float) -> None:
        try:
            await asyncio.wait_for(self.changed.wait(), max(0.05, min(1.0, deadline - time.monotonic())))
        except asyncio.TimeoutError:
            pass

    async def _attempt(self, request, endpoint, path, raw, headers, stream) -> web.StreamResponse:
        """One upstream try; raises for failures that happened before the client saw a byte."""
        async with self.session.post(endpoint.url + path, data=raw, headers=headers) as upstream:
            is_sse = upstream.headers.get("Content-Type", "").startswith("text/event-stream")
            if not (stream and is_sse and upstream.status == 200):
                payload = await upstream.read()
                return web.Response(status=upstream.status, body=payload,
                                    content_type=upstream.headers.get("Content-Type", "application/json").split(";")[0],
                                    headers={**_passthrough(upstream.headers), "X-Specfleet-Pod": endpoint.pod})
            first = await upstream.content.readany()
            if not first:
                raise aiohttp.ServerDisconnectedError("stream ended before its first chunk")
            response = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream",
                                                                "Cache-Control": "no-cache",
                                                                "X-Specfleet-Pod": endpoint.pod})
            await response.prepare(request)
            await response.write(first)
            try:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                error = {"error": {"message": f"pod {endpoint.pod} failed mid-stream: {exc}",
                                   "type": "server_error", "param": None, "code": "upstream_failed"}}
                await response.write(f"data: {json.dumps(error)}\n\n".encode())
            await response.write_eof()
            return response


def _passthrough(headers) -> dict:
    out = {k: v for k, v in headers.items() if k.lower() in ("retry-after",)}
    return out
