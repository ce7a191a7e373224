"""Bad input at the gateway: a clear 4xx in the OpenAI error format, nothing forwarded."""
from __future__ import annotations

import pytest



async def test_an_unknown_model_is_404_in_openai_format_and_names_no_served_model(make_rig):
    rig = await make_rig()
    pod = await rig.add_pod("p0")
    status, body, _ = await rig.post(rig.chat("no-such-model"))
    assert status == 404
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["code"] == "model_not_found"
    assert "tiny" not in body["error"]["message"] and pod.received == 0


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b'{"messages": []}', b'{"model": 7}', b'{"model": ""}'],
                         ids=["not-json", "not-an-object", "no-model", "model-not-a-string", "empty-model"])
async def test_a_malformed_body_is_400_and_reaches_no_engine(make_rig, raw):
    rig = await make_rig()
    pod = await rig.add_pod("p0")
    status, body, _ = await rig.post(raw)
    assert status == 400 and body["error"]["type"] == "invalid_request_error" and pod.received == 0


async def test_an_unknown_path_is_404_in_openai_format(make_rig):
    rig = await make_rig()
    status, body, _ = await rig.post(rig.chat(), path="/v2/anything")
    assert status == 404 and body["error"]["code"] == "not_found"
