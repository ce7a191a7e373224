"""Multi-LoRA through the server as vLLM serves it: `model` names an adapter, /v1/models lists them,
load/unload at run time behind the admin token, vLLM's `lora_requests_info` metric."""
from __future__ import annotations

import concurrent.futures
import json
import shutil
import subprocess
import sys
import threading

import httpx
import openai
import pytest
from lora_kit import build_adapters, peft_greedy
from prometheus_client.parser import text_string_to_metric_families
from testkit import held_after_first_token

from specfleet.engine import LLM, LoRARequest, SamplingParams
from specfleet.engine.server.lora import LoRAModule, parse_lora_module
from specfleet.engine.server.lora_api import LoRAModuleError

TOKEN = {"Authorization": "Bearer s3cret"}
PROMPT = list(range(20, 60))                    # token ids: 2 full KV blocks of 16 to cache
CHAT = [{"role": "user", "content": "Name a prime number."}]
LORA = dict(enable_lora=True, max_loras=2, max_lora_rank=16)


@pytest.fixture(scope="module")
def folders(tiny_llama, tmp_path_factory) -> dict[str, str]:
    return build_adapters(tiny_llama, tmp_path_factory.mktemp("adapters"))


@pytest.fixture(scope="module")
def server(server_factory, folders):
    """Serves `all` and `qv` from start-up; tests that load more unload them again."""
    modules = (LoRAModule("all", folders["all"]), LoRAModule("qv", folders["qv-rslora"], "tiny-base"))
    return server_factory(admin_token="s3cret", lora_modules=modules, **LORA)


@pytest.fixture
def client(server):
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def offline(tiny_llama, folders):
    llm = LLM(tiny_llama, num_kv_blocks=64, **LORA)
    ids = {"all": 1, "qv": 2, "mlp": 3}
    paths = {"all": folders["all"], "qv": folders["qv-rslora"], "mlp": folders["mlp"]}

    def run(prompt, name: str | None, max_tokens: int = 16):
        lora = LoRARequest(name, ids[name], paths[name]) if name else None
        return llm.generate([prompt], SamplingParams(temperature=0, max_tokens=max_tokens), lora_request=lora)[0]
    return run


def load(server, name: str, path: str, headers=TOKEN) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path},
                      headers=headers)


def unload(server, name: str, headers=TOKEN) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/unload_lora_adapter", json={"lora_name": name}, headers=headers)


def model_ids(client) -> list[str]:
    return [m.id for m in client.models.list().data]


@pytest.mark.parametrize("name", ["all", "qv"])
def test_each_adapter_through_the_api_equals_the_offline_engine_and_peft(client, offline, tiny_llama, folders, name):
    resp = client.completions.create(model=name, prompt=PROMPT, max_tokens=16, temperature=0)
    expected = offline(PROMPT, name)
    assert resp.choices[0].text == expected.text and resp.model == name
    assert resp.usage.completion_tokens == len(expected.token_ids)
    assert expected.token_ids == peft_greedy(tiny_llama, folders["all" if name == "all" else "qv-rslora"], PROMPT)
    assert expected.text != offline(PROMPT, None).text                      # the adapter changes the output
    chunks = list(client.completions.create(model=name, prompt=PROMPT, max_tokens=16, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == expected.text and chunks[0].model == name


def test_chat_streamed_and_not_serves_the_adapter_and_the_base_name_serves_the_base(client, server, offline):
    tokenizer = server.engine.tokenizer
    prompt = tokenizer.encode(tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True),
                              add_special_tokens=False)
    for name in ("all", None):
        model = name or "tiny"
        full = client.chat.completions.create(model=model, messages=CHAT, max_tokens=12, temperature=0)
        streamed = client.chat.completions.create(model=model, messages=CHAT, max_tokens=12, temperature=0,
                                                  stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        assert full.choices[0].message.content == text == offline(prompt, name, 12).text
        assert full.model == model


def test_models_lists_each_adapter_with_the_base_as_parent(client, server, folders):
    cards = {m.id: m for m in client.models.list().data}
    assert list(cards) == ["tiny", "all", "qv"]
    assert cards["tiny"].parent is None
    assert (cards["all"].parent, cards["all"].root) == ("tiny", folders["all"])
    assert (cards["qv"].parent, cards["qv"].root) == ("tiny-base", folders["qv-rslora"])    # JSON base_model_name


def test_an_unknown_model_is_404_as_before(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="nope", prompt="hi", max_tokens=2)
    assert err.value.body["code"] == "model_not_found" and "`nope` does not exist" in err.value.body["message"]


def test_load_request_unload_then_404_and_a_reload_never_reuses_the_id_or_its_cache(client, server, offline,
                                                                                   tiny_llama, folders):
    assert load(server, "extra", folders["mlp"]).text == "Success: LoRA adapter 'extra' added successfully."
    assert "extra" in model_ids(client)
    first = client.completions.create(model="extra", prompt=PROMPT, max_tokens=16, temperature=0)
    assert first.choices[0].text == offline(PROMPT, "mlp").text
    old_id = server.state.loras.adapters["extra"].request.lora_int_id
    assert unload(server, "extra").text == "Success: LoRA adapter 'extra' removed successfully."
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="extra", prompt=PROMPT, max_tokens=2)
    assert "extra" not in model_ids(client)
    # The same name over another folder: a new id, so the blocks the old one cached must not answer.
    assert load(server, "extra", folders["all"]).status_code == 200
    assert server.state.loras.adapters["extra"].request.lora_int_id > old_id
    again = client.completions.create(model="extra", prompt=PROMPT, max_tokens=16, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens == 0
    assert again.choices[0].text == offline(PROMPT, "all").text
    assert unload(server, "extra").status_code == 200


def _rank_32(folder: str, tmp_path) -> str:
    copy = tmp_path / "rank32"
    shutil.copytree(folder, copy)
    config = json.loads((copy / "adapter_config.json").read_text())
    (copy / "adapter_config.json").write_text(json.dumps({**config, "r": 32}))
    return str(copy)


def _edited(folder: str, tmp_path, **changes) -> str:
    copy = tmp_path / "edited"
    shutil.copytree(folder, copy)
    config = json.loads((copy / "adapter_config.json").read_text())
    (copy / "adapter_config.json").write_text(json.dumps({**config, **changes}))
    return str(copy)


BAD = {  # case -> (call, status, code, message part)
    "not a PEFT folder": (lambda s, f, tmp: load(s, "x", str(tmp)), 400, "invalid_lora_adapter",
                          "not a PEFT adapter folder"),
    "rank above max": (lambda s, f, tmp: load(s, "x", _rank_32(f["mlp"], tmp)), 400, "invalid_lora_adapter",
                       "exceeds max_lora_rank=16"),
    "a module the model lacks": (lambda s, f, tmp: load(s, "x", _edited(f["mlp"], tmp, target_modules=["fc1"])),
                                 400, "invalid_lora_adapter", "modules the model has no LoRA slot for: ['fc1']"),
    "another base model": (lambda s, f, tmp: load(s, "x", _edited(f["mlp"], tmp,
                                                                  base_model_name_or_path="someone/other-model")),
                           400, "invalid_lora_adapter", "trained on 'someone/other-model'"),
    "name already loaded": (lambda s, f, tmp: load(s, "all", f["mlp"]), 400, "lora_adapter_already_loaded",
                            "has already been loaded"),
    "the base model's name": (lambda s, f, tmp: load(s, "tiny", f["mlp"]), 400, "invalid_lora_name",
                              "base model"),
    "no lora_path": (lambda s, f, tmp: httpx.post(f"{s.base_url}/v1/load_lora_adapter", json={"lora_name": "x"},
                                                  headers=TOKEN), 400, "missing", "lora_path"),
    "unload an unknown name": (lambda s, f, tmp: unload(s, "ghost"), 404, "lora_adapter_not_found",
                               "cannot be found"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_load_or_unload_is_refused_with_its_reason_and_nothing_is_lost(client, server, folders, offline,
                                                                             tmp_path, case):
    call, status, code, message = BAD[case]
    resp = call(server, folders, tmp_path)
    error = resp.json()["error"]
    assert (resp.status_code, error["code"]) == (status, code) and message in error["message"], error
    assert model_ids(client) == ["tiny", "all", "qv"]
    out = client.completions.create(model="all", prompt=PROMPT, max_tokens=8, temperature=0)
    assert out.choices[0].text == offline(PROMPT, "all", 8).text
    assert "x" not in server.state.loras.pending


def test_more_adapters_than_slots_are_served_in_turns_and_none_is_lost(client, server, offline, folders):
    """Two slots and a CPU cache of two, four adapters: all load, and concurrent requests for every one of them
    and the base all finish with each adapter's own output (they wait for a slot, none is refused)."""
    assert [load(server, name, folders[name]).status_code for name in ("mlp", "qv-rslora")] == [200, 200]
    names = ["all", "qv", "mlp", "qv-rslora", None] * 2
    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
        texts = list(pool.map(lambda name: client.completions.create(
            model=name or "tiny", prompt=PROMPT, max_tokens=8, temperature=0).choices[0].text, names))
    own = {"qv-rslora": "qv", "mlp": "mlp"}
    assert texts == [offline(PROMPT, own.get(name, name), 8).text for name in names]
    assert [unload(server, name).status_code for name in ("mlp", "qv-rslora")] == [200, 200]


def test_an_adapter_whose_folder_is_gone_fails_its_requests_with_500_and_the_engine_serves_on(
        client, server, offline, folders, tmp_path):
    """The CPU cache (max_cpu_loras=2) drops `gone` once two other adapters ran; its folder deleted, a request
    for it is refused in the OpenAI format and nothing else is affected (before: the step raised and the
    engine loop died)."""
    assert load(server, "gone", str(shutil.copytree(folders["mlp"], tmp_path / "gone"))).status_code == 200
    client.completions.create(model="gone", prompt=PROMPT, max_tokens=2)
    for name in ("all", "qv"):
        client.completions.create(model=name, prompt=PROMPT, max_tokens=2)
    shutil.rmtree(tmp_path / "gone")
    with pytest.raises(openai.InternalServerError) as err:
        client.completions.create(model="gone", prompt=PROMPT, max_tokens=2)
    body = err.value.body
    assert (body["code"], body["param"]) == ("lora_adapter_unavailable", "model")
    assert "'gone' was dropped from the CPU cache" in body["message"] and "cannot be read again" in body["message"]
    assert server.state.engine.alive
    out = client.completions.create(model="all", prompt=PROMPT, max_tokens=8, temperature=0)
    assert out.choices[0].text == offline(PROMPT, "all", 8).text
    server.wait_idle()
    assert unload(server, "gone").status_code == 200


def test_loading_and_unloading_under_load_loses_no_request(client, server, offline, folders):
    """Requests for the base and two adapters run without pause while other adapters are loaded, used and
    unloaded: every one finishes 200 with its own output, and so does every request for a loaded adapter."""
    expected = {name: offline(PROMPT, name, 6).text for name in ("all", "qv", "mlp", None)}
    stop, results = threading.Event(), []

    def hammer(name):
        while not stop.is_set():
            out = client.completions.create(model=name or "tiny", prompt=PROMPT, max_tokens=6, temperature=0)
            results.append(out.choices[0].text == expected[name])

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        workers = [pool.submit(hammer, name) for name in ("all", "qv", None)]
        try:
            for cycle in range(3):
                assert load(server, f"live{cycle}", folders["mlp"]).status_code == 200
                out = client.completions.create(model=f"live{cycle}", prompt=PROMPT, max_tokens=6, temperature=0)
                results.append(out.choices[0].text == expected["mlp"])
                assert unload(server, f"live{cycle}").status_code == 200
        finally:
            stop.set()
        for worker in workers:
            worker.result()                         # re-raises any request that failed
    assert len(results) >= 6 and all(results)
    assert model_ids(client) == ["tiny", "all", "qv"]


def test_unloading_an_adapter_in_use_is_409_and_the_metric_shows_it_running(client, server, folders):
    assert load(server, "busy", folders["mlp"]).status_code == 200
    with held_after_first_token(server):
        # the request holds the adapter from before its headers come back
        stream = client.completions.create(model="busy", prompt=PROMPT, max_tokens=64, temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        try:
            refused = unload(server, "busy")
            next(iter(stream))
            metrics = httpx.get(f"{server.base_url}/metrics").text
        finally:
            stream.close()
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "lora_adapter_in_use"
    assert "in flight" in refused.json()["error"]["message"]
    info = [line for line in metrics.splitlines() if line.startswith("vllm:lora_requests_info{")]
    assert len(info) == 1 and 'running_lora_adapters="busy"' in info[0] and 'max_lora="2"' in info[0]
    assert 'specfleet:lora_requests_total{lora_name="busy",model_name="tiny"} 1.0' in metrics
    served = {(s.labels["lora_name"], s.labels["parent"]): s.value for family in text_string_to_metric_families(metrics)
              if family.name == "specfleet:lora_adapter_info" for s in family.samples}
    assert served == {("all", "tiny"): 1.0, ("qv", "tiny-base"): 1.0, ("busy", "tiny"): 1.0}   # idle ones too
    server.wait_idle()
    assert unload(server, "busy").status_code == 200
    assert "busy" not in server.engine.lora_names().values()


def test_the_lora_endpoints_need_the_admin_token(server, server_factory, live_server, folders):
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        for resp in (load(server, "y", folders["mlp"], headers), unload(server, "all", headers)):
            assert resp.status_code == 401 and resp.json()["error"]["type"] == "authentication_error"
    assert "y" not in server.state.loras.adapters and "all" in server.state.loras.adapters
    assert load(live_server, "y", folders["mlp"]).status_code == 403          # no admin token configured
    keyed = server_factory(admin_token="s3cret", api_keys=("k1",), **LORA)
    assert load(keyed, "y", folders["mlp"]).status_code == 200               # the admin token, not an API key
    with openai.OpenAI(base_url=f"{keyed.base_url}/v1", api_key="k1", max_retries=0) as c:
        assert c.completions.create(model="y", prompt=PROMPT, max_tokens=2).model == "y"


def test_a_server_without_lora_refuses_to_load_one(live_server, server_factory, folders):
    plain = server_factory(admin_token="s3cret")
    resp = load(plain, "y", folders["mlp"])
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "lora_disabled"
    with pytest.raises(LoRAModuleError, match="'y': this server runs without LoRA"):
        server_factory(lora_modules=(LoRAModule("y", folders["mlp"]),))


def test_lora_modules_take_name_equals_path_or_vllms_json():
    assert parse_lora_module("sql=/a/b=c") == LoRAModule("sql", "/a/b=c")
    assert parse_lora_module('{"name": "sql", "path": "/a", "base_model_name": "m"}') == LoRAModule("sql", "/a", "m")
    for bad in ("sql", "=/a", '{"name": "sql"}', '{"name": "s", "path": "/a", "extra": 1}'):
        with pytest.raises(ValueError):
            parse_lora_module(bad)


def test_serve_exits_with_one_line_naming_a_bad_start_up_adapter(tiny_llama, folders, tmp_path):
    cmd = [sys.executable, "-m", "specfleet.cli.main", "engine", "serve", "--model", tiny_llama, "--device", "cpu",
           "--num-kv-blocks", "16", "--enable-lora", "--lora-modules", f"good={folders['all']}",
           f"broken={tmp_path}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (f"error: LoRA adapter 'broken' ({tmp_path}): {tmp_path} is not "
                                                    "a PEFT adapter folder (no adapter_config.json)")
