"""Opt-in fault injection for tests (`ServerConfig(faults=True)`; never on by default).

`POST /_faults {"method": "POST", "path": "/deployments", "status": 500, "count": 2, "delay_s": 0}` makes the
next `count` matching requests (method, path substring) wait `delay_s` and then fail with `status` (a
Kubernetes Status body; 409 is a Conflict) — or, with `status: 0`, only wait (a slow server, for timeouts).
`GET /_faults` lists the rules, how often each fired and when (`fired_at`, epoch seconds: the spacing of a
client's retries); `DELETE /_faults` clears them.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field

from aiohttp import web

from specfleet.cluster.apiserver.errors import ApiError

REASONS = {409: "Conflict", 429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable",
           504: "Timeout"}


@dataclass
class Fault:
    method: str
    path: str
    status: int = 500
    count: int = 1
    delay_s: float = 0.0
    fired: int = 0
    fired_at: list[float] = field(default_factory=list)

    def matches(self, request: web.Request) -> bool:
        return self.fired < self.count and request.method == self.method.upper() and self.path in request.path


class Faults:
    def __init__(self) -> None:
        self.rules: list[Fault] = []

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/_faults", self.list), web.post("/_faults", self.add), web.delete("/_faults", self.clear)]

    async def list(self, request: web.Request) -> web.Response:
        return web.json_response([asdict(rule) for rule in self.rules])

    async def add(self, request: web.Request) -> web.Response:
        body = await request.json()
        rule = Fault(body["method"], body["path"], int(body.get("status", 500)), int(body.get("count", 1)),
                     float(body.get("delay_s", 0.0)))
        self.rules.append(rule)
        return web.json_response(asdict(rule), status=201)

    async def clear(self, request: web.Request) -> web.Response:
        self.rules.clear()
        return web.json_response([])

    @web.middleware
    async def middleware(self, request: web.Request, handler) -> web.StreamResponse:
        rule = next((r for r in self.rules if not request.path.startswith("/_faults") and r.matches(request)), None)
        if rule is None:
            return await handler(request)
        rule.fired += 1
        rule.fired_at.append(time.time())
        await asyncio.sleep(rule.delay_s)
        if rule.status == 0:
            return await handler(request)
        raise ApiError(rule.status, REASONS.get(rule.status, "InternalError"), f"injected fault ({rule.status})")
