"""The engine's live speculation ceiling (`--max-speculative-tokens`): the operator starts a pod at the
plan's k and retunes it up to the service's maxSpeculativeTokens through the admin API."""
from __future__ import annotations

import httpx
import pytest

from specfleet.engine.config import EngineConfig


def test_the_admin_api_deepens_k_up_to_the_ceiling_and_not_past_it(server_factory):
    server = server_factory(admin_token="s3cret", speculative_method="ngram", num_speculative_tokens=1,
                            max_speculative_tokens=4)
    url, auth = f"{server.base_url}/admin/speculation", {"Authorization": "Bearer s3cret"}
    assert httpx.get(url, headers=auth).json()["num_speculative_tokens"] == 1
    state = httpx.post(url, json={"enabled": True, "num_speculative_tokens": 4}, headers=auth).json()
    assert (state["num_speculative_tokens"], state["max_speculative_tokens"]) == (4, 4)
    assert httpx.post(url, json={"num_speculative_tokens": 5}, headers=auth).status_code == 400


def test_without_a_ceiling_the_start_up_depth_is_the_limit(server_factory):
    server = server_factory(admin_token="s3cret", speculative_method="ngram", num_speculative_tokens=2)
    url, auth = f"{server.base_url}/admin/speculation", {"Authorization": "Bearer s3cret"}
    assert httpx.post(url, json={"num_speculative_tokens": 3}, headers=auth).status_code == 400


def test_a_ceiling_below_the_start_up_depth_is_an_error():
    with pytest.raises(ValueError, match="max_speculative_tokens"):
        EngineConfig(model="unused", speculative_method="ngram", num_speculative_tokens=4, max_speculative_tokens=2)
