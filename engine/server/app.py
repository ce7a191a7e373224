"""The FastAPI app: OpenAI endpoints, health/readiness, Prometheus metrics and the admin API.

With API keys configured, every route but `/health`, `/ready`, `/metrics` (probes, scrapers) and
`/admin/*` (its own token) answers 401 without one (`auth.ApiKeyGate`); the admin API is off unless an
admin token is given. With --enable-lora, a request's `model` may name a LoRA adapter, `/v1/models` lists
the adapters, and vLLM's load/unload endpoints (`lora_api`) take the admin token.

Every error leaves in the OpenAI shape `{"error": {"message", "type", "param", "code"}}`: our own
errors, request validation (422 becomes 400, as OpenAI answers), unknown routes and anything unexpected.
"""
from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from http import HTTPStatus

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from specfleet.engine.server import admin, lora_api
from specfleet.engine.server.async_engine import AsyncEngine
from specfleet.engine.server.auth import Access, ApiKeyGate
from specfleet.engine.server.limits import AdmissionGate, BodyLimit, ServerLimits
from specfleet.engine.server.lora import LoRAModule, LoRARegistry
from specfleet.engine.server.metrics import ServerMetrics
from specfleet.engine.server.openai_protocol import (ChatCompletionRequest, CompletionRequest, OpenAIError,
                                                     error_body, model_card)
from specfleet.engine.server.serving import OpenAIServing, ServerState

log = logging.getLogger("specfleet.engine.server")
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "invalid_request_error", 405: "invalid_request_error", 409: "conflict_error",
               413: "invalid_request_error", 415: "invalid_request_error", 429: "rate_limit_error",
               503: "service_unavailable_error"}


def create_app(engine: AsyncEngine, metrics: ServerMetrics | None = None, admin_token: str | None = None,
               limits: ServerLimits | None = None, api_keys: tuple[str, ...] = (),
               lora_modules: tuple[LoRAModule, ...] = ()) -> FastAPI:
    """Build the app around an AsyncEngine; the app's lifespan starts and stops its stepping thread.
    `lora_modules` are validated here (raises `lora_api.LoRAModuleError`), before the thread starts."""
    metrics = metrics or ServerMetrics(engine.engine.model_name)
    metrics.attach(engine)
    limits = limits or ServerLimits()
    access = Access(tuple(api_keys), admin_token)
    loras = LoRARegistry(engine.engine.model_name, enabled=engine.engine.config.enable_lora,
                         fetch=lora_api.fetch_options(engine.engine.config))
    lora_api.serve_lora_modules(engine.engine, loras, lora_modules)
    metrics.loras = loras
    state = ServerState(engine, metrics, engine.engine.model_name, access, limits, loras)
    serving = OpenAIServing(state)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start(asyncio.get_running_loop())
        yield
        engine.stop()

    app = FastAPI(title="specfleet engine", lifespan=lifespan)
    app.state.server = state
    app.add_middleware(BodyLimit, max_bytes=limits.max_request_bytes)
    config = engine.engine.config
    app.add_middleware(AdmissionGate, limit=limits.max_in_flight or config.max_num_seqs + config.max_waiting_requests)
    app.add_middleware(ApiKeyGate, access=access)            # added last: outermost, before any body is read
    _install_error_handlers(app)
    app.include_router(admin.router)
    app.include_router(lora_api.router)

    @app.post("/v1/completions", dependencies=[Depends(require_json)])
    async def completions(body: CompletionRequest, request: Request):
        return await serving.completions(body, request)

    @app.post("/v1/chat/completions", dependencies=[Depends(require_json)])
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await serving.chat(body, request)

    @app.get("/v1/models")
    async def models() -> dict:
        cards = [model_card(state.model_name, state.created, state.max_model_len)]
        cards += [model_card(name, state.created, state.max_model_len, s.root, s.parent)
                  for name, s in state.loras.adapters.items()]
        return {"object": "list", "data": cards}

    @app.get("/health")
    async def health():
        if not engine.alive:
            return _error(503, "the engine thread is not running", code="engine_dead")
        return {"status": "ok"}

    @app.get("/ready")
    async def ready():
        if state.draining:
            return _error(503, "draining", code="draining")
        if not engine.alive:
            return _error(503, "the engine is not running", code="engine_dead")
        return {"status": "ready", "model": state.model_name}

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app


def require_json(request: Request) -> None:
    content_type = request.headers.get("content-type")
    if content_type and "json" not in content_type.split(";")[0].lower():
        raise OpenAIError(415, f"Content-Type must be application/json, got {content_type!r}",
                          code="unsupported_media_type")


def _error(status: int, message: str, type: str | None = None, param: str | None = None,
           code: str | int | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    body = error_body(message, type or ERROR_TYPES.get(status, "server_error" if status >= 500 else
                                                        "invalid_request_error"), param, code)
    return JSONResponse(body, status_code=status, headers=headers)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def openai_error(request: Request, exc: OpenAIError):
        return _error(exc.status, exc.message, exc.type, exc.param, exc.code, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        first = errors[0] if errors else {}
        if first.get("type") == "json_invalid":
            detail = (first.get("ctx") or {}).get("error", "")
            return _error(400, f"the request body is not valid JSON: {detail}".rstrip(": "), code="json_invalid")
        loc = [str(part) for part in first.get("loc", ()) if part != "body"]
        message = "; ".join(_describe(e) for e in errors[:5]) or "invalid request"
        return _error(400, message, param=".".join(loc) or None, code=first.get("type"))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        message = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
        if exc.status_code == 404:
            message = f"{request.method} {request.url.path} not found"
        code = HTTPStatus(exc.status_code).phrase.lower().replace(" ", "_")
        return _error(exc.status_code, message, code=code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return _error(500, f"internal error: {type(exc).__name__}", "server_error", code="internal_error")


def _describe(error: dict) -> str:
    loc = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
    return f"{loc}: {error.get('msg')}" if loc else str(error.get("msg"))
