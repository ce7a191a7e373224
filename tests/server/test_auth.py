"""API keys on the OpenAI endpoints (401 in the OpenAI shape), probes left open, and an admin API that is
off unless a token is configured."""
from __future__ import annotations

import httpx
import openai
import pytest
from typer.testing import CliRunner

from specfleet.engine.server import auth

KEYS = ("key-one", "key-two")


@pytest.fixture(scope="module")
def locked(server_factory):
    """API keys configured, no admin token: the admin API must be off."""
    return server_factory(api_keys=KEYS)


def _client(server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=key, max_retries=0, timeout=60)


def test_the_openai_client_raises_authentication_error_for_a_wrong_key(locked):
    with _client(locked, "not-a-key") as client, pytest.raises(openai.AuthenticationError) as raised:
        client.completions.create(model="tiny", prompt="hi", max_tokens=2)
    assert raised.value.status_code == 401
    assert raised.value.body["type"] == "authentication_error" and raised.value.body["code"] == "invalid_api_key"


def test_every_configured_key_is_accepted(locked):
    for key in KEYS:
        with _client(locked, key) as client:
            out = client.completions.create(model="tiny", prompt="hi", max_tokens=3, temperature=0)
            assert out.usage.completion_tokens >= 1
            assert [m.id for m in client.models.list()] == ["tiny"]


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer"}, {"Authorization": f"Basic {KEYS[0]}"},
                                     {"Authorization": f"Bearer {KEYS[0]}x"}, {"X-Api-Key": KEYS[0]}],
                         ids=["none", "empty bearer", "other scheme", "key with a suffix", "other header"])
def test_a_missing_or_wrong_key_gets_401_in_the_openai_shape(locked, headers):
    for method, path in (("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("GET", "/v1/models"),
                         ("GET", "/docs"), ("GET", "/no-such-route")):
        resp = httpx.request(method, locked.base_url + path, json={"model": "tiny", "prompt": "x"}, headers=headers)
        assert resp.status_code == 401, (path, resp.text)
        assert set(resp.json()["error"]) == {"message", "type", "param", "code"}
        assert resp.headers["www-authenticate"] == "Bearer"


def test_an_oversized_body_without_a_key_is_refused_before_it_is_read(locked):
    resp = httpx.post(locked.base_url + "/v1/completions", content=b"x" * (8 * 1024 * 1024),
                      headers={"Content-Type": "application/json"})
    assert resp.status_code == 401                      # not 413: the key is checked first


def test_probes_and_metrics_stay_open_without_a_key(locked):
    for path in ("/health", "/ready", "/metrics"):
        assert httpx.get(locked.base_url + path).status_code == 200, path


def test_the_admin_api_is_off_without_an_admin_token_even_for_an_api_key(locked):
    url = locked.base_url + "/admin/speculation"
    for headers in ({}, {"Authorization": f"Bearer {KEYS[0]}"}):
        for resp in (httpx.get(url, headers=headers), httpx.post(url, json={"enabled": False}, headers=headers)):
            assert resp.status_code == 403
            assert resp.json()["error"]["code"] == "admin_api_disabled"
            assert "--admin-token-file" in resp.json()["error"]["message"]


def test_keys_come_from_flags_files_and_the_environment(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# one key per line\nfile-key\n\n  spaced-key  \nflag-key\n")
    found = auth.load_api_keys(["flag-key"], [keys], {auth.API_KEY_ENV: "env-key\n"})
    assert found == ("flag-key", "file-key", "spaced-key", "env-key")
    assert auth.load_api_keys([], [], {}) == ()


def test_an_empty_key_file_or_key_is_an_error(tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n\n")
    with pytest.raises(ValueError, match="holds no key"):
        auth.load_api_keys([], [empty], {})
    with pytest.raises(ValueError, match="empty"):
        auth.load_api_keys([" "], [], {})


def test_keys_are_compared_in_constant_time_and_never_printed():
    import inspect

    source = inspect.getsource(auth.matches)
    assert "hmac.compare_digest" in source and "==" not in source
    assert auth.matches("b", ("a", "b")) and not auth.matches("b ", ("a", "b")) and not auth.matches("", ("a",))
    access = auth.Access(("secret-key",), "secret-token")
    assert "secret" not in repr(access) and "secret" not in str(access)


def test_serve_refuses_an_unreadable_key_file_before_loading_the_model(tmp_path):
    from specfleet.cli.engine_cmds import app

    result = CliRunner().invoke(app, ["serve", "--model", "no-such-model", "--api-key-file",
                                      str(tmp_path / "missing")])
    assert result.exit_code == 2 and "missing" in result.output
