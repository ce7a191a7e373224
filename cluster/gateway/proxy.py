"""The gateway's HTTP face: one OpenAI-compatible endpoint in front of the ready pods of every
InferenceService (`routing`), holding requests while a service has none (`holding`), behind API keys
(`keys`), with Prometheus metrics (`metrics`); routes come from the API by watching (`follow`).

Failures: a connection error, a reset, or a 429/502/503/504 before the first byte reached the client is
retried on another pod (up to `max_attempts`) and the failing pod is ejected for a moment; a draining
engine answers 503, so a scale-down costs a retry, not the request. Non-streaming answers are forwarded
only once complete; streams start only once the first chunk arrived.

LoRA adapters (`adapters`): a request whose `model` names an adapter goes to a pod serving it. When none
does yet but the service declares it, the request waits (held, up to `adapter_wait_s` once the service has
ready pods) for the operator to load it: the gateway cannot load it itself, as the admin token is a
per-service Secret only the operator reads and the adapter's folder is resolved in the pod. After the
wait it goes to any pod by load. A pod that answers 404 (or `lora_adapter_unavailable`) for the adapter
is retried like a 503, without being ejected. A `model` that is neither a served model nor an adapter a
service declares or a pod serves, also after the next poll of the pods, is 404 `model_not_found`.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from specfleet.cluster.api_client import ApiClient
from specfleet.cluster.gateway import follow, queues
from specfleet.cluster.gateway.connect import Connection
from specfleet.cluster.gateway.holding import HoldRefused, Holds
from specfleet.cluster.gateway.keys import OPEN_PATHS, ApiKeys, keys_in_secret
from specfleet.cluster.gateway.metrics import GatewayMetrics, labels
from specfleet.cluster.gateway.routing import Balancer, Endpoint, Route, prefix_key, routes_from
from specfleet.engine.server.openai_protocol import error_body

log = logging.getLogger("specfleet.gateway")
RETRY_STATUS = {429, 502, 503, 504}


@dataclass
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    namespaces: list[str] | None = None     # None: every namespace
    max_held: int = 64                      # requests held per service while it has no ready replica
    hold_timeout_s: float = 120.0           # longest a request waits for a ready replica
    retry_after_s: int = 5                  # Retry-After on a 503 for a full or timed-out hold
    max_attempts: int = 4
    api_keys: ApiKeys = field(default_factory=ApiKeys)
    gateway_id: str = "local"               # names this replica's held-requests annotation
    announce_held: bool = True              # write that annotation (needs `patch` on inferenceservices)
    adapter_wait_s: float = 10.0            # longest a request for a declared adapter waits for a pod serving it

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536 or self.max_attempts < 1 or self.adapter_wait_s < 0:
            raise ValueError("port must be 1..65535, max attempts at least 1 and the adapter wait >= 0")
        Holds(self.max_held, self.hold_timeout_s, self.retry_after_s)     # validates the hold bounds


def openai_error(status: int, message: str, kind: str, code: str, headers: dict | None = None,
                 param: str | None = None) -> web.Response:
    return web.json_response(error_body(message, kind, param, code), status=status, headers=headers)


def model_not_found(model: str) -> web.Response:
    """OpenAI's answer (and the engine's) for an unknown model: 404, `param` "model", `model_not_found`."""
    shown = model if len(model) <= 100 else model[:100] + "..."
    return openai_error(404, f"The model `{shown}` does not exist; GET /v1/models lists the served models and "
                        "adapters.", "invalid_request_error", "model_not_found", param="model")


def adapter_missing(result: web.StreamResponse, adapter: str | None) -> bool:
    """A pod's answer that it lacks the adapter (unloaded meanwhile, or its folder gone): try another pod."""
    if adapter is None or not isinstance(result, web.Response):
        return False
    return result.status == 404 or (result.status == 500 and b"lora_adapter_unavailable" in (result.body or b""))


class Gateway:
    def __init__(self, connection: Connection | str, config: GatewayConfig | None = None):
        self.connection = Connection(connection) if isinstance(connection, str) else connection
        self.config = config or GatewayConfig()
        self.host, self.port = self.config.host, self.config.port
        self.balancer = Balancer()
        self.metrics = GatewayMetrics()
        self.holds = Holds(self.config.max_held, self.config.hold_timeout_s, self.config.retry_after_s,
                           self._held_changed)
        self.keys = self.config.api_keys
        self.stats = {"requests": 0, "retries": 0, "failed": 0}
        self.synced = False
        self.draining = False
        self.changed = asyncio.Event()
        self.polled = asyncio.Event()           # set (and replaced) after each poll of the pods
        self.poll_rounds = 0
        self.session: aiohttp.ClientSession | None = None
        self.runner: web.AppRunner | None = None
        self.announcer: follow.Announcer | None = None
        self._tasks: list[asyncio.Task] = []

    @property
    def routes(self) -> dict[str, Route]:
        return self.balancer.routes

    # -- lifecycle ----------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[self._auth])
        app.router.add_get("/health", self.health)
        app.router.add_get("/ready", self.ready)
        app.router.add_get("/metrics", self.metrics_page)
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
        await web.TCPSite(self.runner, self.host, self.port, reuse_address=True).start()
        self._tasks = [asyncio.create_task(self._follow()), asyncio.create_task(queues.poll_forever(
            self.session, self.balancer, self._polled))]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.runner.cleanup()
        await self.session.close()

    async def drain(self, timeout_s: float) -> None:
        """Turn unready (load balancers stop sending), then wait for in-flight and held requests."""
        self.draining = True
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and (self.holds.counts or any(self.balancer.outstanding.values())):
            await asyncio.sleep(0.1)

    async def _follow(self) -> None:
        c = self.connection
        async with ApiClient(c.url, user_agent="specfleet-gateway", token=c.token, ssl_context=c.ssl_context) as api:
            if self.config.announce_held:
                self.announcer = follow.Announcer(api, self.config.gateway_id)
                self._tasks.append(asyncio.create_task(self.announcer.run()))
            await follow.follow(api, self.config.namespaces, self._set_routes, self.keys.secret, self._set_secret)

    def _set_routes(self, isvcs: list[dict], services: list[dict], pods: list[dict]) -> None:
        self.balancer.routes = routes_from(isvcs, services, pods)
        self.synced = True
        for route in self.balancer.routes.values():
            self.metrics.endpoints.labels(*labels(route.key)).set(len(route.endpoints))
        self._wake_held()

    def _wake_held(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def _polled(self, adapters_changed: bool) -> None:
        if adapters_changed:
            self._wake_held()
        self.poll_rounds += 1
        self.polled.set()
        self.polled = asyncio.Event()

    async def _after_fresh_poll(self, timeout_s: float = 2.0) -> None:
        """Wait until a poll that started after now has finished (the one under way may predate a load)."""
        target, deadline = self.poll_rounds + 2, time.monotonic() + timeout_s
        while self.poll_rounds < target and time.monotonic() < deadline:
            try:
                await asyncio.wait_for(self.polled.wait(), deadline - time.monotonic())
            except asyncio.TimeoutError:
                return

    def _set_secret(self, secret: dict | None) -> None:
        self.keys.secret_keys = keys_in_secret(secret)
        if not self.keys.secret_keys:
            log.warning("API key Secret %s/%s is missing or holds no key: every request is refused", *self.keys.secret)

    def _held_changed(self, service: str, count: int) -> None:
        self.metrics.held.labels(*labels(service)).set(count)
        if self.announcer is not None:
            self.announcer.note(service, count)

    # -- handlers -----------------------------------------------------------------------------------
    @web.middleware
    async def _auth(self, request: web.Request, handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS or self.keys.accepted(request.headers.get("Authorization")):
            return await handler(request)
        message = ("missing API key: send 'Authorization: Bearer <key>'" if "Authorization" not in request.headers
                   else "incorrect API key provided")
        return openai_error(401, message, "authentication_error", "invalid_api_key", {"WWW-Authenticate": "Bearer"})

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "models": sorted(self.routes), "stats": self.stats,
                                  "held": dict(self.holds.counts),
                                  "readyReplicas": {m: len(r.endpoints) for m, r in sorted(self.routes.items())}})

    async def ready(self, request: web.Request) -> web.Response:
        ready = self.synced and not self.draining
        return web.json_response({"ready": ready, "draining": self.draining}, status=200 if ready else 503)

    async def metrics_page(self, request: web.Request) -> web.Response:
        body, content_type = self.metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def models(self, request: web.Request) -> web.Response:
        """Each served model, then each adapter with its service's model as `parent` (as vLLM lists them);
        an adapter's `readyReplicas` counts the pods serving it."""
        data = [{"id": model, "object": "model", "created": 0, "owned_by": "specfleet", "parent": None,
                 "specfleet": {"inferenceService": r.key, "readyReplicas": len(r.endpoints)}}
                for model, r in sorted(self.routes.items())]
        for name, r in sorted(self.balancer.adapters().items()):
            holders = sum(name in self.balancer.served.get(e.url, ()) for e in r.endpoints)
            data.append({"id": name, "object": "model", "created": 0, "owned_by": "specfleet", "parent": r.model,
                         "specfleet": {"inferenceService": r.key, "readyReplicas": holders,
                                       "declared": name in r.adapters}})
        return web.json_response({"object": "list", "data": data})

    async def not_found(self, request: web.Request) -> web.Response:
        return openai_error(404, f"no route {request.method} {request.path}", "invalid_request_error", "not_found")

    async def proxy(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("model"), str) or not body["model"]:
            self.metrics.requests.labels("", "", "400").inc()
            return openai_error(400, "the body must be a JSON object with a string `model` field",
                                "invalid_request_error", "invalid_body")
        found = self.balancer.resolve(body["model"])
        if found is None and self.balancer.urls():
            await self._after_fresh_poll()                 # an adapter loaded a moment ago: not a miss
            found = self.balancer.resolve(body["model"])
        if found is None:
            self.metrics.requests.labels("", "", "404").inc()
            return model_not_found(body["model"])
        route, adapter = found
        self.stats["requests"] += 1
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        if "Authorization" in request.headers:
            headers["Authorization"] = request.headers["Authorization"]
        response = await self._forward(request, raw, headers, route, adapter, prefix_key(body),
                                       bool(body.get("stream")))
        self.metrics.requests.labels(*labels(route.key), str(response.status)).inc()
        return response

    def _picker(self, model: str, adapter: str | None, key: str | None):
        """`pick(exclude)` for one request. For a declared adapter: only pods serving it, until `adapter_wait_s`
        after the service first had a ready pod; then (and at once for an adapter no service declares, which
        nothing will load) pods serving it first, else any pod, whose own answer then counts."""
        strict_until: float | None = None

        def pick(exclude: set[str]) -> Endpoint | None:
            nonlocal strict_until
            route = self.balancer.routes.get(model)
            declared = route is not None and adapter in route.adapters
            if declared and strict_until is None and route.endpoints:
                strict_until = time.monotonic() + self.config.adapter_wait_s
            strict = declared and (strict_until is None or time.monotonic() < strict_until)
            return self.balancer.pick(model, key, exclude, adapter, strict)
        return pick

    async def _forward(self, request, raw, headers, route: Route, adapter: str | None, key,
                       stream) -> web.StreamResponse:
        model, arrived = route.model, time.monotonic()
        deadline, tried, attempts = arrived + self.config.hold_timeout_s, set(), 0
        last: web.Response | None = None
        pick = self._picker(model, adapter, key)
        while attempts < self.config.max_attempts:
            endpoint = pick(tried) or pick(set())
            if endpoint is None:
                try:
                    await self.holds.until(route.key, lambda: pick(set()) is not None,
                                           lambda: self.changed, deadline)
                except HoldRefused as refused:
                    self.stats["failed"] += 1
                    return openai_error(503, str(refused), "service_unavailable", f"hold_{refused.reason}",
                                        {"Retry-After": str(refused.retry_after_s)})
                continue
            if attempts == 0:
                self.metrics.queue_seconds.labels(*labels(route.key)).observe(time.monotonic() - arrived)
            else:
                self.stats["retries"] += 1
                self.metrics.retries.labels(*labels(route.key)).inc()
            attempts += 1
            result = await self._try(request, endpoint, raw, headers, stream, tried, adapter)
            if isinstance(result, web.Response) and (result.status in RETRY_STATUS or adapter_missing(result, adapter)):
                last = result
                continue
            return result
        self.stats["failed"] += 1
        return last or openai_error(503, f"no replica of `{model}` answered", "service_unavailable", "upstream_failed")

    async def _try(self, request, endpoint: Endpoint, raw, headers, stream, tried: set[str],
                   adapter: str | None = None) -> web.StreamResponse:
        """One upstream attempt; a response that is worth a retry elsewhere marks the pod tried (and ejects
        it when it is gone or draining)."""
        self.balancer.started(endpoint.url)
        try:
            result = await self._attempt(request, endpoint, raw, headers, stream)
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as exc:
            log.info("%s failed before the first byte (%s); retrying elsewhere", endpoint.pod, exc)
            self.balancer.eject(endpoint.url)
            tried.add(endpoint.url)
            return openai_error(502, f"pod {endpoint.pod} failed before answering", "server_error", "upstream_failed")
        finally:
            self.balancer.finished(endpoint.url)
        if isinstance(result, web.Response) and result.status in RETRY_STATUS:
            tried.add(endpoint.url)
            if result.status == 503:
                self.balancer.eject(endpoint.url)
        elif adapter_missing(result, adapter):
            tried.add(endpoint.url)
            self.balancer.forget(endpoint.url, adapter)
        return result

    async def _attempt(self, request, endpoint: Endpoint, raw, headers, stream) -> web.StreamResponse:
        """One upstream try; raises for failures that happened before the client saw a byte."""
        async with self.session.post(endpoint.url + request.path_qs, data=raw, headers=headers) as upstream:
            is_sse = upstream.headers.get("Content-Type", "").startswith("text/event-stream")
            if not (stream and is_sse and upstream.status == 200):
                payload = await upstream.read()
                passthrough = {k: v for k, v in upstream.headers.items() if k.lower() == "retry-after"}
                return web.Response(status=upstream.status, body=payload,
                                    content_type=upstream.headers.get("Content-Type", "application/json").split(";")[0],
                                    headers={**passthrough, "X-Specfleet-Pod": endpoint.pod})
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
                error = error_body(f"pod {endpoint.pod} failed mid-stream: {exc}", "server_error", None,
                                   "upstream_failed")
                await response.write(f"data: {json.dumps(error)}\n\n".encode())
            await response.write_eof()
            return response
