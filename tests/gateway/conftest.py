"""A gateway in front of stand-in engine pods, all in-process: the API emulator holds an InferenceService,
its Service and Pods (each pod's `podIP`:containerPort is a small aiohttp app), and the real `Gateway`
follows them by watching, as it does on a cluster."""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import yaml
import pytest
from aiohttp import web

from specfleet.cluster import resources
from specfleet.cluster.api_client import ApiClient
from specfleet.cluster.apiserver.server import ApiServer, ServerConfig
from specfleet.cluster.gateway import Gateway, GatewayConfig
from testkit import free_port

ROOT = Path(__file__).resolve().parents[2]
NS, NAME, MODEL = "default", "tiny-cpu", "tiny"
LABELS = {"app.kubernetes.io/instance": NAME}


@dataclass
class StandIn:
    """One engine pod: answers chat completions with `status` (200: a completion), counts what it got. It
    serves the base model and `adapters` (exported in /metrics as the engine does; others: 404)."""

    name: str
    status: int = 200
    delay_s: float = 0.0
    received: int = 0
    adapters: set[str] = field(default_factory=set)
    advertised: set[str] | None = None       # what /metrics says it serves (None: `adapters`)
    port: int = field(default_factory=free_port)
    runner: web.AppRunner | None = None

    async def start(self) -> "StandIn":
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/metrics", self.metrics)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        return self

    async def metrics(self, _request: web.Request) -> web.Response:
        info = "".join(f'specfleet:lora_adapter_info{{model_name="{MODEL}",lora_name="{name}",parent="{MODEL}"}} 1.0\n'
                       for name in sorted(self.adapters if self.advertised is None else self.advertised))
        return web.Response(text="vllm:num_requests_waiting 0\n" + info)

    async def chat(self, request: web.Request) -> web.Response:
        self.received += 1
        await asyncio.sleep(self.delay_s)
        if self.status != 200:
            return web.json_response({"error": {"message": "draining", "type": "service_unavailable",
                                                "param": None, "code": None}}, status=self.status)
        body = await request.json()
        if body["model"] not in {MODEL, *self.adapters}:
            return web.json_response({"error": {"message": f"The model `{body['model']}` does not exist.",
                                                "type": "invalid_request_error", "param": "model",
                                                "code": "model_not_found"}}, status=404)
        return web.json_response({"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                                  "choices": [{"index": 0, "finish_reason": "stop",
                                               "message": {"role": "assistant", "content": self.name}}],
                                  "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})


@dataclass
class Rig:
    api: ApiClient
    gateway: Gateway
    base: str
    stand_ins: list[StandIn] = field(default_factory=list)

    async def add_pod(self, name: str, ready: bool = True, **kw) -> StandIn:
        stand_in = await StandIn(name, **kw).start()
        self.stand_ins.append(stand_in)
        await self.add_pod_at(name, stand_in.port, ready)
        return stand_in

    async def add_pod_at(self, name: str, port: int, ready: bool = True) -> None:
        """A Pod of the service whose engine listens on 127.0.0.1:`port`."""
        await self.api.create({"apiVersion": "v1", "kind": "Pod",
                               "metadata": {"name": name, "namespace": NS, "labels": LABELS},
                               "spec": {"containers": [{"name": "engine", "image": "x",
                                                        "ports": [{"name": "http", "containerPort": port}]}]}})
        await self.api.patch("Pod", NS, name, {"status": {
            "phase": "Running", "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}, "status")

    async def declare(self, *adapters: str) -> None:
        """Set the InferenceService's spec.adapters and wait until the gateway saw it."""
        await self.api.patch("InferenceService", NS, NAME, {"spec": {"adapters": [
            {"name": name, "source": f"adapters/{name}"} for name in adapters]}})
        await self.until(lambda: self.gateway.routes[MODEL].adapters == adapters)

    async def post(self, body, path: str = "/v1/chat/completions", headers: dict | None = None,
                   timeout: float = 10.0) -> tuple[int, dict, dict]:
        """(status, JSON body, headers) of one POST through the gateway."""
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
            async with session.post(self.base + path, data=data, headers={"Content-Type": "application/json",
                                                                           **(headers or {})}) as r:
                return r.status, await r.json(content_type=None), dict(r.headers)

    @staticmethod
    def chat(model: str = MODEL) -> dict:
        return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

    async def isvc(self) -> dict:
        return await self.api.get("InferenceService", NS, NAME)

    async def until(self, probe, timeout: float = 10.0):
        for _ in range(int(timeout / 0.05)):
            value = probe()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return value
            await asyncio.sleep(0.05)
        raise AssertionError("condition not met in time")


def _isvc() -> dict:
    return yaml.safe_load((ROOT / "manifests/examples/tiny-cpu.yaml").read_text())


async def _until_crd_served(api: ApiClient) -> None:
    for _ in range(100):
        try:
            await api.list("InferenceService")
            return
        except Exception:   # noqa: BLE001  (not served yet)
            await asyncio.sleep(0.05)


async def _close(rig: Rig) -> None:
    await rig.gateway.stop()
    for stand_in in rig.stand_ins:
        await stand_in.runner.cleanup()
    await rig.api.__aexit__()


@pytest.fixture
async def make_rig():
    """`await make_rig(**GatewayConfig fields)`: an API emulator with the CRD, one InferenceService and its
    Service (no pods yet), and a started gateway."""
    server = ApiServer(ServerConfig(host="127.0.0.1", port=0)).start()
    made: list[Rig] = []

    async def make(**config) -> Rig:
        api = ApiClient(server.url, user_agent="test")
        await api.__aenter__()
        await api.create(yaml.safe_load(resources.crd_text()))
        await _until_crd_served(api)
        await api.create(_isvc())
        await api.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": NAME, "namespace": NS},
                          "spec": {"selector": LABELS, "ports": [{"port": 8000, "targetPort": "http"}]}})
        gateway = Gateway(server.url, GatewayConfig(port=free_port(), **config))
        await gateway.start()
        rig = Rig(api, gateway, f"http://127.0.0.1:{gateway.port}")
        made.append(rig)
        await rig.until(lambda: MODEL in gateway.routes)
        return rig

    try:
        yield make
    finally:
        for rig in made:
            await _close(rig)
        server.stop()


