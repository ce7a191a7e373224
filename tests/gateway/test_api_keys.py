"""API keys on the gateway: from a file and from a watched Secret; 401 in the OpenAI error format;
the probe and scrape paths stay open."""
from __future__ import annotations

import base64

import aiohttp
import pytest

from specfleet.cluster.gateway.keys import ApiKeys, keys_in_secret, parse_secret_ref

SECRET = ("default", "gateway-keys")


def _secret(*keys: str) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET[1], "namespace": SECRET[0]},
            "data": {"keys": base64.b64encode("\n".join(keys).encode()).decode()}}


def _bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


async def test_without_a_key_or_with_a_wrong_one_the_answer_is_401_in_openai_format(make_rig, tmp_path):
    (tmp_path / "keys").write_text("# gateway keys\nsk-right\n")
    rig = await make_rig(api_keys=ApiKeys.from_flags([str(tmp_path / "keys")], None))
    pod = await rig.add_pod("p0")
    for headers in ({}, _bearer("sk-wrong"), {"Authorization": "Basic sk-right"}):
        status, body, answer = await rig.post(rig.chat(), headers=headers)
        assert status == 401 and body["error"]["type"] == "authentication_error"
        assert body["error"]["code"] == "invalid_api_key" and answer["WWW-Authenticate"] == "Bearer"
    assert pod.received == 0
    status, _, _ = await rig.post(rig.chat(), headers=_bearer("sk-right"))
    assert status == 200 and pod.received == 1


async def test_health_ready_and_metrics_stay_open_while_the_api_is_locked(make_rig, tmp_path):
    (tmp_path / "keys").write_text("sk-right\n")
    rig = await make_rig(api_keys=ApiKeys.from_flags([str(tmp_path / "keys")], None))
    async with aiohttp.ClientSession() as session:
        for path in ("/health", "/ready", "/metrics"):
            async with session.get(rig.base + path) as r:
                assert r.status == 200, path
        async with session.get(rig.base + "/v1/models") as r:
            assert r.status == 401


async def test_keys_follow_the_watched_secret_and_a_missing_secret_locks_the_door(make_rig):
    rig = await make_rig(api_keys=ApiKeys.from_flags([], "default/gateway-keys"))
    await rig.add_pod("p0")
    assert (await rig.post(rig.chat(), headers=_bearer("sk-one")))[0] == 401     # no Secret yet: locked
    await rig.api.create(_secret("sk-one"))
    assert await rig.until(lambda: _status(rig, "sk-one", 200))
    await rig.api.patch("Secret", *SECRET, {"data": {"keys": base64.b64encode(b"sk-two").decode()}})
    assert await rig.until(lambda: _status(rig, "sk-one", 401))                 # rotated out
    assert (await rig.post(rig.chat(), headers=_bearer("sk-two")))[0] == 200


async def _status(rig, key: str, expected: int) -> bool:
    return (await rig.post(rig.chat(), headers=_bearer(key)))[0] == expected


def test_secret_values_are_keys_one_per_line_comments_and_blanks_skipped():
    secret = {"data": {"a": base64.b64encode(b"k1\n\n# note\n k2 \n").decode()}, "stringData": {"b": "k3"}}
    assert keys_in_secret(secret) == ("k1", "k2", "k3")
    assert keys_in_secret(None) == ()


@pytest.mark.parametrize("text", ["gateway-keys", "/name", "ns/", "a/b/c"])
def test_a_secret_reference_must_be_namespace_slash_name(text):
    with pytest.raises(ValueError, match="NAMESPACE/NAME"):
        parse_secret_ref(text)


def test_no_key_source_leaves_the_gateway_open_and_keys_never_print():
    assert ApiKeys().accepted(None)
    keys = ApiKeys(("sk-secret",))
    assert not keys.accepted(None) and "sk-secret" not in repr(keys)
