"""The adapter sync's I/O (`control/adapter_sync.py`) against a real engine server (the tiny Llama, real
PEFT adapters): declared adapters get loaded, removed ones unloaded, an unload refused with 409 while a
request uses the adapter is retried on the next run and that request finishes, and a folder the engine
refuses becomes `lastError`, a Warning Event and Degraded. Adapter folders are relative to the engine's
working directory, as on a pod (`render._working_dir`)."""
from __future__ import annotations

import json
import shutil

import openai
import pytest
from lora_kit import build_adapter
from remote_kit import serving_folder
from testkit import LiveServer, held_after_first_token, start_server

from specfleet.operator.control.adapter_sync import AdapterSync
from specfleet.operator.control.discovery import EnginePod

TOKEN = "s3cret"
PROMPT = list(range(20, 60))


class SecretOnly:
    """The one Kubernetes read the sync makes: the `<name>-admin` Secret."""

    def get(self, kind: str, namespace: str, name: str) -> dict | None:
        assert (kind, namespace, name) == ("Secret", "ns", "svc-admin")
        return {"stringData": {"token": TOKEN}}


@pytest.fixture(scope="module")
def volume(tiny_llama, tmp_path_factory):
    """A model volume: adapters/<name> folders (two good ones, one that is not PEFT, one of rank 32)."""
    root = tmp_path_factory.mktemp("volume")
    build_adapter(tiny_llama, root / "adapters/a", 1, r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    build_adapter(tiny_llama, root / "adapters/b", 2, r=8, lora_alpha=8, target_modules=["o_proj", "down_proj"])
    (root / "adapters/not-peft").mkdir()
    (root / "adapters/not-peft/README").write_text("not an adapter")
    shutil.copytree(root / "adapters/a", root / "adapters/r32")
    config = json.loads((root / "adapters/r32/adapter_config.json").read_text())
    (root / "adapters/r32/adapter_config.json").write_text(json.dumps({**config, "r": 32}))
    return root


@pytest.fixture
def server(tiny_llama, volume, monkeypatch, tmp_path):
    monkeypatch.chdir(volume)
    live = start_server(tiny_llama, admin_token=TOKEN, enable_lora=True, max_loras=2, max_lora_rank=16,
                        lora_cache_dir=str(tmp_path / "lora-cache"))
    try:
        yield live
    finally:
        live.stop()


def body(adapters: list[dict], status: dict | None = None) -> dict:
    """The service with `spec.lora` set, so that LoRA stays on with no adapter declared."""
    spec = {"model": {"name": "tiny", "source": "hostpath:/models"}, "slo": {"ttftP99Ms": 1000, "itlP99Ms": 100},
            "accelerator": {"type": "cpu", "count": 1}, "adapters": adapters, "lora": {"maxLoras": 2}}
    return {"metadata": {"name": "svc", "namespace": "ns", "generation": 1}, "spec": spec, "status": status or {}}


def pods(server: LiveServer) -> list[EnginePod]:
    return [EnginePod("ns", "svc", "pod-0", server.base_url, None)]


def served(server: LiveServer) -> dict[str, str]:
    return {n: s.root for n, s in server.state.loras.adapters.items()}


async def test_declared_adapters_load_and_an_edit_unloads_and_loads_live(server):
    sync = AdapterSync(SecretOnly())
    first = await sync.run(body([{"name": "a", "source": "adapters/a"}, {"name": "b", "source": "adapters/b"}]),
                           pods(server))
    assert served(server) == {"a": "adapters/a", "b": "adapters/b"}
    assert first.status["adapters"] == [{"name": "a", "readyPods": 1}, {"name": "b", "readyPods": 1}]
    assert first.status["adapterCount"] == 2 and "conditions" not in first.status
    assert first.events == [("Normal", "AdaptersSynced", "pod-0: loaded a, loaded b")]
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0, timeout=60) as client:
        assert client.completions.create(model="b", prompt=PROMPT, max_tokens=4, temperature=0).model == "b"
    edited = body([{"name": "b", "source": "adapters/a"}], first.status)        # a removed, b moved
    second = await sync.run(edited, pods(server))
    assert served(server) == {"b": "adapters/a"}
    assert second.events == [("Normal", "AdaptersSynced", "pod-0: unloaded a, unloaded b, loaded b")]
    assert (await sync.run(edited, pods(server))).events == []                  # in sync: nothing to do


async def test_an_unload_refused_while_a_request_runs_is_retried_and_the_request_finishes(server):
    sync = AdapterSync(SecretOnly())
    await sync.run(body([{"name": "a", "source": "adapters/a"}]), pods(server))
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0, timeout=60)
    with held_after_first_token(server):
        stream = client.completions.create(model="a", prompt=PROMPT, max_tokens=16, temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        refused = await sync.run(body([]), pods(server))
        assert served(server) == {"a": "adapters/a"}                          # 409: kept for now
    assert refused.status["adapters"] == [] and refused.events == []
    finished = [c.choices[0].finish_reason for c in stream if c.choices and c.choices[0].finish_reason]
    assert finished == ["length"]                                              # the request lost nothing
    server.wait_idle()
    retried = await sync.run(body([]), pods(server))
    assert served(server) == {} and retried.events == [("Normal", "AdaptersSynced", "pod-0: unloaded a")]
    client.close()


async def test_a_folder_the_engine_refuses_is_last_error_an_event_and_degraded(server):
    sync = AdapterSync(SecretOnly())
    declared = [{"name": "good", "source": "adapters/a"}, {"name": "junk", "source": "adapters/not-peft"},
                {"name": "big", "source": "adapters/r32"}, {"name": "remote", "source": "hf://org/x"}]
    conditions = [{"type": "Degraded", "status": "False", "reason": "PlanFeasible", "message": "fine"}]
    out = await sync.run(body(declared, {"conditions": conditions}), pods(server))
    entries = {e["name"]: e for e in out.status["adapters"]}
    assert served(server) == {"good": "adapters/a"} and entries["good"] == {"name": "good", "readyPods": 1}
    assert "not a PEFT adapter folder" in entries["junk"]["lastError"]
    assert "rank r=32 exceeds max_lora_rank=16" in entries["big"]["lastError"]
    assert entries["remote"]["lastError"].startswith("unsupported source 'hf://org/x'")
    degraded = next(c for c in out.status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "AdapterFailed")
    assert "adapter junk: pod pod-0:" in degraded["message"] and "adapter remote:" in degraded["message"]
    warnings = [e for e in out.events if e[0] == "Warning"]
    assert [e[2].split(":")[0] for e in warnings] == ["adapter junk", "adapter big", "adapter remote"]
    again = await sync.run(body(declared, out.status), pods(server))
    assert again.events == []                                                  # same errors: no new Event
    fixed = await sync.run(body(declared[:1], again.status), pods(server))
    assert next(c for c in fixed.status["conditions"] if c["type"] == "Degraded")["reason"] == "PlanFeasible"


async def test_an_adapter_by_url_is_loaded_as_declared_and_then_left_alone(server, volume):
    """The engine fetches an http(s):// source itself and lists it as its `root`, so the next run finds it in
    sync: no reload, no request to the source; a URL that 404s is its lastError."""
    sync = AdapterSync(SecretOnly())
    with serving_folder(volume) as web:
        declared = [{"name": "web", "source": f"{web.url}/adapters/b"},
                    {"name": "gone", "source": f"{web.url}/adapters/nothing"}]
        first = await sync.run(body(declared), pods(server))
        assert served(server) == {"web": f"{web.url}/adapters/b"}
        entries = {e["name"]: e for e in first.status["adapters"]}
        assert entries["web"] == {"name": "web", "readyPods": 1} and "HTTP 404" in entries["gone"]["lastError"]
        requests = len(web.paths)
        again = await sync.run(body(declared[:1], first.status), pods(server))
        assert again.events == [] and served(server) == {"web": f"{web.url}/adapters/b"}
        assert len(web.paths) == requests


async def test_with_lora_off_the_adapter_status_is_cleared_once_and_then_costs_nothing():
    sync = AdapterSync(SecretOnly())
    plain = body([])
    del plain["spec"]["lora"]
    assert await sync.run(plain, []) is None                                   # never declared: untouched
    plain["status"] = {"adapters": [{"name": "a", "readyPods": 0, "lastError": "x"}], "adapterCount": 1,
                       "conditions": [{"type": "Degraded", "status": "True", "reason": "AdapterFailed"}]}
    out = await sync.run(plain, [])
    assert out.status["adapters"] is None and out.status["adapterCount"] is None        # merge patch: removed
    assert [(c["status"], c["reason"]) for c in out.status["conditions"]] == [("False", "PlanFeasible")]
