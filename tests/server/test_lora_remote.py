"""Remote LoRA adapters through the server: `lora_path` (or `--lora-modules`) as an http(s):// folder URL or
an oci:// artifact on a real registry is fetched into the LoRA cache and served with the same greedy output
as the folder; a bad source is a 400 (a remote that cannot be reached a 502) and the engine serves on."""
from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path

import httpx
import openai
import pytest
from lora_kit import build_adapter
from remote_kit import ADAPTER_FILES, push, registry, serving_folder
from testkit import free_port

from specfleet.engine.server.lora import LoRAModule

TOKEN = {"Authorization": "Bearer s3cret"}
PROMPT = list(range(20, 60))


@pytest.fixture(scope="module")
def web_root(tiny_llama, tmp_path_factory) -> Path:
    """A folder served over HTTP: `mlp/` (a real PEFT adapter) and `junk/` (a config that is no adapter)."""
    root = tmp_path_factory.mktemp("web")
    build_adapter(tiny_llama, root / "mlp", 3, r=8, lora_alpha=8, target_modules=["gate_proj", "up_proj", "down_proj"])
    (root / "junk").mkdir()
    (root / "junk/adapter_config.json").write_text('{"peft_type": "PROMPT_TUNING"}')
    (root / "junk/adapter_model.safetensors").write_bytes(b"")
    return root


@pytest.fixture(scope="module")
def web(web_root):
    with serving_folder(web_root) as server:
        yield server


@pytest.fixture(scope="module")
def server(server_factory, web_root, web, tmp_path_factory):
    """Serves `local` (the folder) and `web` (the same adapter by URL, fetched at start-up)."""
    modules = (LoRAModule("local", str(web_root / "mlp")), LoRAModule("web", f"{web.url}/mlp"))
    return server_factory(admin_token="s3cret", lora_modules=modules, enable_lora=True, max_loras=2,
                          lora_cache_dir=str(tmp_path_factory.mktemp("lora-cache")))


def load(server, name: str, path: str) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path},
                      headers=TOKEN, timeout=60)


def unload(server, name: str) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/unload_lora_adapter", json={"lora_name": name}, headers=TOKEN)


def greedy(server, model: str) -> str:
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0, timeout=60) as client:
        return client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0).choices[0].text


def roots(server) -> dict[str, str]:
    cards = httpx.get(f"{server.base_url}/v1/models").json()["data"]
    return {card["id"]: card["root"] for card in cards if card.get("parent")}


def test_a_start_up_adapter_by_url_serves_the_folders_output_and_lists_its_url_as_root(server, web, web_root):
    assert greedy(server, "web") == greedy(server, "local") != greedy(server, "tiny")
    assert roots(server) == {"local": str(web_root / "mlp"), "web": f"{web.url}/mlp"}


def test_a_runtime_load_by_url_reuses_the_cached_copy_without_a_request(server, web):
    before = len(web.paths)
    assert load(server, "web2", f"{web.url}/mlp").status_code == 200
    assert len(web.paths) == before                                      # fetched at start-up: no request
    assert greedy(server, "web2") == greedy(server, "local")
    assert unload(server, "web2").status_code == 200


def test_a_slow_fetch_stalls_neither_the_event_loop_nor_the_engines_steps(server, web_root):
    """The download runs on a worker thread: while it waits 2 s per file, a streamed completion finishes."""
    with serving_folder(web_root, delay_s=2.0) as slow, concurrent.futures.ThreadPoolExecutor(1) as pool:
        loading = pool.submit(load, server, "slow", f"{slow.url}/mlp")
        time.sleep(0.3)                                               # the load is waiting for its first file
        started = time.monotonic()
        assert httpx.get(f"{server.base_url}/health").status_code == 200
        assert greedy(server, "local") and not loading.done()
        assert time.monotonic() - started < 2.0
        assert loading.result().status_code == 200
    assert greedy(server, "slow") == greedy(server, "local")
    assert unload(server, "slow").status_code == 200


@pytest.mark.parametrize("case, status, code, message", [
    ("404", 400, "invalid_lora_adapter", "answered HTTP 404"),
    ("junk", 400, "invalid_lora_adapter", "holds a PROMPT_TUNING adapter"),
    ("down", 502, "lora_source_unavailable", "cannot reach"),
])
def test_a_bad_remote_source_is_refused_and_the_engine_serves_on(server, web, case, status, code, message):
    path = {"404": f"{web.url}/missing", "junk": f"{web.url}/junk", "down": f"http://127.0.0.1:{free_port()}/x"}[case]
    resp = load(server, "bad", path)
    error = resp.json()["error"]
    assert (resp.status_code, error["code"], error["param"]) == (status, code, "lora_path") and message in \
        error["message"], error
    assert "bad" not in roots(server) and "bad" not in server.state.loras.pending
    assert greedy(server, "web") == greedy(server, "local")


def test_an_oci_artifact_on_a_real_registry_serves_the_folders_output_and_then_comes_from_the_cache(
        server, web_root, tmp_path):
    with registry(tmp_path / "registry") as host:
        push(f"{host}/adapters/mlp:v1", [web_root / "mlp" / name for name in ADAPTER_FILES])
        ref = f"oci://{host}/adapters/mlp:v1"
        assert load(server, "oci", ref).status_code == 200
        missing = load(server, "nope", f"oci://{host}/adapters/mlp:v9")
        assert missing.status_code == 400 and "answered HTTP 404" in missing.json()["error"]["message"]
    assert roots(server)["oci"] == ref
    assert greedy(server, "oci") == greedy(server, "local")
    assert unload(server, "oci").status_code == 200
    assert load(server, "oci-again", ref).status_code == 200            # the registry is gone: from the cache
    assert greedy(server, "oci-again") == greedy(server, "local")
    assert unload(server, "oci-again").status_code == 200
