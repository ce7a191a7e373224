"""vLLM's runtime LoRA endpoints, behind the admin token, and the adapters given at start-up.

`POST /v1/load_lora_adapter {"lora_name", "lora_path"}` validates the folder on the stepping thread
(between steps) and serves it under `lora_name`; a `lora_path` that is an https:// folder URL or an oci://
reference is first fetched into the LoRA cache (`engine/lora/fetch.py`) on a worker thread, so neither the
event loop nor the engine's steps wait for the download. `POST /v1/unload_lora_adapter {"lora_name"}`
takes it out of service and frees its slot. Both answer vLLM's plain-text success line, or an
OpenAI-shaped error: 400 for a bad folder or source (404 upstream, not an adapter, a digest mismatch), a
rank above --max-lora-rank, a name already served or LoRA off; 502 when the source's server cannot be
reached, times out or fails (a gateway's upstream error: the request was fine, retry later); 404 for
unloading an unknown name; 409 for unloading an adapter with requests in flight (nothing is aborted;
retry once they end). Like `/admin/*` they need the admin bearer token (403 without one configured).
"""
from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Iterable

from fastapi import APIRouter, Depends, Request
from fastapi.responses import PlainTextResponse

from specfleet.engine.config import EngineConfig
from specfleet.engine.engine import LLMEngine
from specfleet.engine.lora.fetch import FetchOptions, SourceUnavailable, default_cache_dir, is_remote, localize
from specfleet.engine.server.admin import require_admin
from specfleet.engine.server.async_engine import EngineDead
from specfleet.engine.server.lora import LoRAModule, LoRARegistry
from specfleet.engine.server.openai_protocol import (LoadLoRAAdapterRequest, OpenAIError, UnloadLoRAAdapterRequest,
                                                     bad_request)

router = APIRouter(prefix="/v1", dependencies=[Depends(require_admin)], tags=["lora"])


class LoRAModuleError(ValueError):
    """An adapter given at start-up that cannot be served; the message names it and the reason."""


def fetch_options(config: EngineConfig) -> FetchOptions:
    cache = Path(config.lora_cache_dir).expanduser() if config.lora_cache_dir else default_cache_dir()
    return FetchOptions(cache, tuple(config.lora_insecure_registries))


def serve_lora_modules(engine: LLMEngine, registry: LoRARegistry, modules: Iterable[LoRAModule]) -> None:
    """Fetch, validate and register start-up adapters (before the stepping thread runs); raises LoRAModuleError."""
    for module in modules:
        try:
            request = registry.reserve(module.name, module.path)
            request = replace(request, lora_path=localize(module.path, registry.fetch))
            engine.load_lora(request)
        except OpenAIError as exc:
            raise LoRAModuleError(f"LoRA adapter {module.name!r}: {exc.message}") from None
        except ValueError as exc:
            raise LoRAModuleError(f"LoRA adapter {module.name!r} ({module.path}): {exc}") from None
        registry.commit(request, module.base_model_name, _source(module.path))


@router.post("/load_lora_adapter")
async def load_lora_adapter(body: LoadLoRAAdapterRequest, request: Request) -> PlainTextResponse:
    state = request.app.state.server
    lora = state.loras.reserve(body.lora_name, body.lora_path)
    try:
        lora = replace(lora, lora_path=await asyncio.to_thread(localize, body.lora_path, state.loras.fetch))
        await state.engine.call(lambda engine: engine.load_lora(lora))
    except EngineDead as exc:
        state.loras.abandon(lora)
        raise OpenAIError(503, str(exc), "service_unavailable_error", code="engine_dead") from exc
    except SourceUnavailable as exc:
        state.loras.abandon(lora)
        raise OpenAIError(502, f"LoRA adapter {body.lora_name!r} cannot be fetched now: {exc}", "server_error",
                          "lora_path", "lora_source_unavailable") from exc
    except ValueError as exc:
        state.loras.abandon(lora)
        raise bad_request(f"LoRA adapter {body.lora_name!r} cannot be loaded: {exc}", "lora_path",
                          "invalid_lora_adapter") from exc
    state.loras.commit(lora, source=_source(body.lora_path))
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


def _source(path: str) -> str | None:
    return path if is_remote(path) else None


@router.post("/unload_lora_adapter")
async def unload_lora_adapter(body: UnloadLoRAAdapterRequest, request: Request) -> PlainTextResponse:
    state = request.app.state.server
    served = state.loras.remove(body.lora_name)          # from here on, requests naming it get 404
    try:
        await state.engine.call(lambda engine: engine.remove_lora(served.request.lora_int_id))
    except EngineDead as exc:
        state.loras.restore(served)
        raise OpenAIError(503, str(exc), "service_unavailable_error", code="engine_dead") from exc
    except ValueError as exc:                                # still in use inside the engine: keep serving it
        state.loras.restore(served)
        raise OpenAIError(409, f"The lora adapter '{body.lora_name}' is in use: {exc}", "conflict_error",
                          "lora_name", "lora_adapter_in_use") from exc
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
