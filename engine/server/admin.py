"""Admin API: the operator's live speculation switch, off unless a bearer token is configured.

`GET /admin/speculation` reports the state; `POST /admin/speculation {"enabled", "num_speculative_tokens"}`
changes it (the engine applies it at its next step). Without `--admin-token-file` every admin route
answers 403 `admin_api_disabled`; with it, a missing or wrong token gets 401 (`auth.require_admin`).
409 while speculation is not configured.
"""
from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from specfleet.engine.server import auth
from specfleet.engine.server.openai_protocol import OpenAIError, SpeculationUpdate, bad_request
from specfleet.engine.speculative.control import SpeculationNotConfigured


def require_admin(request: Request) -> None:
    auth.require_admin(request.app.state.server.access, request.headers.get("authorization"))


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
