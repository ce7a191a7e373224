"""Admin API: the operator's live speculation switch, behind a bearer token when one is configured.

`GET /admin/speculation` reports the state; `POST /admin/speculation {"enabled", "num_speculative_tokens"}`
changes it (the engine applies it at its next step). 409 while speculation is not configured.
"""
from __future__ import annotations

import hmac
from pathlib import Path

from fastapi import APIRouter, Depends, Request

from specfleet.engine.server.openai_protocol import OpenAIError, SpeculationUpdate, bad_request
from specfleet.engine.spec.control import SpeculationNotConfigured


def read_token_file(path: str | Path) -> str:
    token = Path(path).read_text(encoding="utf-8").strip()
    if not token:
        raise ValueError(f"admin token file {path} is empty")
    return token


def require_admin(request: Request) -> None:
    expected = request.app.state.server.admin_token
    if expected is None:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected.encode()):
        raise OpenAIError(401, "missing or wrong admin bearer token", "authentication_error",
                          code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


router = APIRouter(prefix="/admin", dependencies=[Depends(require_admin)], tags=["admin"])


@router.get("/speculation")
def get_speculation(request: Request) -> dict:
    return request.app.state.server.engine.engine.get_speculation()


@router.post("/speculation")
def set_speculation(update: SpeculationUpdate, request: Request) -> dict:
    engine = request.app.state.server.engine.engine
    try:
        return engine.set_speculation(update.enabled, update.num_speculative_tokens)
    except SpeculationNotConfigured as exc:
        raise OpenAIError(409, str(exc), "conflict_error", code="speculation_not_configured") from exc
    except ValueError as exc:
        raise bad_request(str(exc), "num_speculative_tokens") from exc
