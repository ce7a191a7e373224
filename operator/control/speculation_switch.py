"""The speculation switch out: POST `/admin/speculation` on one specfleet engine pod (`set_speculation`),
with the service's admin token; the runner calls it on every pod when the controller changes its choice
and on any pod whose scrape disagrees with it (vLLM pods get a Deployment annotation instead).
"""
from __future__ import annotations

import httpx

from specfleet.operator.control.scrape import SCRAPE_TIMEOUT_S


async def set_speculation(base_url: str, enabled: bool, k: int, token: str | None,
                          timeout: float = SCRAPE_TIMEOUT_S, client: httpx.AsyncClient | None = None) -> dict:
    """Switch one pod's speculation; raises httpx.HTTPError on failure."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body = {"enabled": enabled, "num_speculative_tokens": k}
    own = client is None
    client = client or httpx.AsyncClient(timeout=timeout)
    try:
        response = await client.post(base_url.rstrip("/") + "/admin/speculation", json=body, headers=headers,
                                     timeout=timeout)
        response.raise_for_status()
        return response.json()
    finally:
        if own:
            await client.aclose()
