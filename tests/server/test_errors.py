"""Wrong input gets a 4xx in the OpenAI error shape, and the server keeps serving."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

GOOD = {"model": "tiny", "prompt": "hello", "max_tokens": 2}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def assert_openai_error(resp, status: int, code=None, param=None) -> dict:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"] and error["type"]
    if code is not None:
        assert error["code"] == code
    if param is not None:
        assert error["param"] == param
    return error


@pytest.mark.parametrize("path, body, status, code, param", [
    ("/v1/completions", {**GOOD, "max_tokens": -1}, 400, None, "max_tokens"),
    ("/v1/completions", {**GOOD, "max_tokens": 0}, 400, None, "max_tokens"),
    ("/v1/completions", {**GOOD, "temperature": 2.5}, 400, None, "temperature"),
    ("/v1/completions", {**GOOD, "top_p": 0}, 400, None, "top_p"),
    ("/v1/completions", {**GOOD, "max_tokens": "many"}, 400, None, "max_tokens"),
    ("/v1/completions", {"model": "tiny"}, 400, "missing", "prompt"),
    ("/v1/completions", {**GOOD, "prompt": 5}, 400, None, None),
    ("/v1/completions", {**GOOD, "prompt": []}, 400, None, "prompt"),
    ("/v1/completions", {**GOOD, "prompt": [1, 2, 10**9]}, 400, None, None),
    ("/v1/completions", {**GOOD, "n": 0}, 400, None, "n"),
    ("/v1/completions", {**GOOD, "n": 1000}, 400, None, "n"),
    ("/v1/completions", {**GOOD, "echo": True}, 400, "unsupported", "echo"),
    ("/v1/completions", {**GOOD, "presence_penalty": 0.5}, 400, "unsupported", "presence_penalty"),
    ("/v1/completions", {**GOOD, "model": "gpt-4"}, 404, "model_not_found", "model"),
    ("/v1/completions", {**GOOD, "prompt": "x " * 1500}, 400, "context_length_exceeded", None),
    ("/v1/completions", {**GOOD, "max_tokens": 5000}, 400, "context_length_exceeded", "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "messages": []}, 400, None, "messages"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "wizard", "content": "hi"}]}, 400, None, None),
    ("/v1/chat/completions", {"model": "tiny"}, 400, "missing", "messages"),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function"}]}, 400, "unsupported", "tools"),
    ("/v1/chat/completions", {**CHAT, "model": "nope"}, 404, "model_not_found", "model"),
    ("/v1/chat/completions", [1, 2, 3], 400, None, None),
])
def test_bad_requests_get_openai_errors(http, path, body, status, code, param):
    assert_openai_error(http.post(path, json=body), status, code, param)


def test_malformed_json_is_a_400(http):
    resp = http.post("/v1/completions", content=b'{"prompt": "x",', headers={"content-type": "application/json"})
    assert_openai_error(resp, 400, "json_invalid")


def test_wrong_content_type_is_a_415(http):
    resp = http.post("/v1/completions", content=json.dumps(GOOD), headers={"content-type": "text/plain"})
    assert_openai_error(resp, 415, "unsupported_media_type")


def test_unknown_route_and_wrong_method(http):
    assert_openai_error(http.get("/v1/engines"), 404, "not_found")
    assert_openai_error(http.get("/v1/completions"), 405)


def test_openai_client_raises_typed_errors(openai_client):
    import openai

    with pytest.raises(openai.NotFoundError) as info:
        openai_client.completions.create(model="nope", prompt="x", max_tokens=1)
    assert info.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        openai_client.completions.create(model="tiny", prompt="x", max_tokens=-3)


def test_server_keeps_serving_after_errors(http):
    for body in (b"{", b"[]", b'{"prompt": null}'):
        http.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    resp = http.post("/v1/completions", json=GOOD)
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] >= 1


_json_value = st.recursive(st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats(allow_nan=False, allow_infinity=False)
                           | st.text(max_size=20), lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=8)
_fields = {
    "model": st.sampled_from(["tiny", "other", ""]) | _json_value,
    "prompt": st.text(max_size=40) | st.lists(st.integers(-5, 600), max_size=20) | _json_value,
    "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "bot"]),
                                                "content": st.text(max_size=30) | _json_value}), max_size=3),
    "max_tokens": st.integers(-3, 6) | _json_value,
    "max_completion_tokens": st.integers(-3, 6),
    "temperature": st.floats(-1, 3, allow_nan=False) | _json_value,
    "top_p": st.floats(-0.5, 1.5, allow_nan=False), "top_k": st.integers(-3, 100),
    "n": st.integers(-1, 4), "seed": st.integers(-2**70, 2**70) | st.none(),
    "stop": st.text(max_size=5) | st.lists(st.text(max_size=5), max_size=3) | _json_value,
    "logprobs": st.integers(-2, 25) | st.booleans(), "top_logprobs": st.integers(-2, 25),
    "stream": st.booleans(), "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}) | _json_value,
    "ignore_eos": st.booleans(), "stop_token_ids": st.lists(st.integers(-2, 10**6), max_size=3),
}


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]),
       body=st.fixed_dictionaries({}, optional=_fields) | _json_value)
def test_fuzzed_requests_never_get_a_5xx(http, path, body):
    if isinstance(body, dict) and isinstance(body.get("max_tokens"), int) and body.get("max_tokens", 0) > 6:
        body["max_tokens"] = 6
    if isinstance(body, dict) and "max_tokens" not in body and path.endswith("chat/completions"):
        body["max_tokens"] = 4          # chat defaults to the whole context: keep the fuzz fast
    resp = http.post(path, json=body)
    assert resp.status_code < 500, resp.text
    if resp.status_code >= 400:
        assert_openai_error(resp, resp.status_code)
