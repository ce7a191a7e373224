"""End to end under `specfleet up`: LoRA adapters declared in an InferenceService are loaded into the running
engine pod by the operator, edited live without a restart, and bad ones reported.

A tiny random Llama whose folder (the model's hostPath volume) also holds real PEFT adapters under
adapters/ (made by `peft`, tests/lora_kit.py) plus a folder that is not an adapter and one of rank 32.
In file order: two adapters reach `status.adapters` ready on the pod and answer a chat completion through
the `openai` client with `model=<adapter>`; removing one and adding another loads and unloads them in the
same pod (same uid, no restart, the Deployment's template untouched); a non-PEFT folder and a rank above
`lora.maxLoraRank` become `lastError`, `Degraded=True/AdapterFailed` and Warning Events.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml
from lora_kit import build_adapter
from testkit import BIN, specfleet_up, wait_for

ROOT = Path(__file__).resolve().parents[2]
TINY_CR = ROOT / "manifests/examples/tiny-cpu.yaml"
NAME, MODEL = "tiny-lora", "tiny"
ENV = {"SPECFLEET_NODE_CPUS": "4", "SPECFLEET_NODE_MEMORY": "64Gi", "SPECFLEET_CONTROL_INTERVAL": "1",
       "SPECFLEET_DETECT_INTERVAL": "0"}
CHAT = [{"role": "user", "content": "Name a prime number."}]

pytestmark = pytest.mark.slow


def model_with_adapters(folder: Path) -> Path:
    """The model folder, with adapters/{a,b,c} trained on it (their base is this very folder),
    adapters/junk (not PEFT) and adapters/r32 (rank 32)."""
    from specfleet.engine.tiny_model import build_tiny_model

    model = build_tiny_model(folder, "llama")
    adapters = model / "adapters"
    for seed, name in enumerate("abc", start=1):
        build_adapter(str(model), adapters / name, seed, r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    (adapters / "junk").mkdir()
    (adapters / "junk/notes.txt").write_text("not an adapter")
    shutil.copytree(adapters / "a", adapters / "r32")
    config = json.loads((adapters / "r32/adapter_config.json").read_text())
    (adapters / "r32/adapter_config.json").write_text(json.dumps({**config, "r": 32}))
    return model


class Fleet:
    def __init__(self, workdir: Path):
        self.workdir, self.kubeconfig = workdir, workdir / ".specfleet/kubeconfig"

    def kubectl(self, *args: str) -> str:
        proc = subprocess.run([str(BIN / "kubectl"), "--kubeconfig", str(self.kubeconfig), "--cache-dir",
                               str(self.workdir / "kcache"), *args], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    def get(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def status(self) -> dict:
        return self.get("infsvc", NAME).get("status") or {}

    def adapters(self) -> dict[str, dict]:
        return {e["name"]: e for e in self.status().get("adapters") or []}

    def set_adapters(self, adapters: list[dict]) -> None:
        self.kubectl("patch", "infsvc", NAME, "--type=merge", "-p", json.dumps({"spec": {"adapters": adapters}}))

    def pod(self) -> dict:
        pods = [p for p in self.get("pods")["items"] if not p["metadata"].get("deletionTimestamp")]
        assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
        return pods[0]

    def pod_url(self) -> str:
        pod = self.pod()
        return f"http://{pod['status']['podIP']}:{pod['spec']['containers'][0]['ports'][0]['containerPort']}"

    def served(self) -> set[str]:
        models = httpx.get(self.pod_url() + "/v1/models", timeout=10).json()["data"]
        return {m["id"] for m in models if m.get("parent")}

    def events(self, reason: str) -> list[str]:
        return [e["message"] for e in self.get("events")["items"] if e.get("reason") == reason]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("adapters")
    model = model_with_adapters(workdir / "model")
    doc = yaml.safe_load(TINY_CR.read_text())
    doc["metadata"]["name"] = NAME
    doc["spec"]["model"].update(name=MODEL, source=f"hostpath:{model}")
    doc["spec"].pop("speculation", None)
    doc["spec"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 1}
    doc["spec"]["lora"] = {"maxLoras": 2, "maxLoraRank": 16}
    doc["spec"]["adapters"] = [{"name": "a", "source": "adapters/a"}, {"name": "b", "source": "adapters/b"}]
    cr = workdir / "tiny-lora.yaml"
    cr.write_text(yaml.safe_dump(doc))
    with specfleet_up(workdir, cr, {**os.environ, **ENV}) as (proc, _port):
        f = Fleet(workdir)
        wait_for(lambda: proc.poll() is None and f.kubeconfig.exists() and (f.status().get("readyReplicas") or 0) >= 1,
                 timeout=120)
        yield f


def chat(fleet: Fleet, model: str):
    from openai import OpenAI

    with OpenAI(base_url=fleet.pod_url() + "/v1", api_key="unused", max_retries=0, timeout=60) as client:
        return client.chat.completions.create(model=model, messages=CHAT, max_tokens=8, temperature=0)


def test_declared_adapters_are_loaded_on_the_pod_and_serve_chat(fleet):
    ready = wait_for(lambda: (a := fleet.adapters()) and all(e.get("readyPods") == 1 for e in a.values()) and a,
                     timeout=30)
    assert ready == {"a": {"name": "a", "readyPods": 1}, "b": {"name": "b", "readyPods": 1}}
    assert fleet.served() == {"a", "b"} and fleet.status()["adapterCount"] == 2
    header, row = fleet.kubectl("get", "infsvc", NAME).splitlines()[:2]
    assert row[header.index("ADAPTERS"):].split()[0] == "2"                    # columns line up under headers
    args = fleet.pod()["spec"]["containers"][0]["args"]
    assert args[args.index("--enable-lora"):args.index("--enable-lora") + 5] == [
        "--enable-lora", "--max-loras", "2", "--max-lora-rank", "16"]
    answer = chat(fleet, "a")
    assert answer.model == "a" and answer.usage.completion_tokens >= 1
    assert chat(fleet, MODEL).model == MODEL                                    # the base model still serves
    assert wait_for(lambda: fleet.events("AdaptersSynced"), timeout=10)


def test_editing_the_list_loads_and_unloads_live_without_a_restart(fleet):
    before, deployment = fleet.pod(), fleet.get("deployment", NAME)
    fleet.set_adapters([{"name": "b", "source": "adapters/b"}, {"name": "c", "source": "adapters/c"}])
    assert wait_for(lambda: fleet.served() == {"b", "c"}, timeout=30)
    assert wait_for(lambda: fleet.adapters() == {"b": {"name": "b", "readyPods": 1},
                                                 "c": {"name": "c", "readyPods": 1}}, timeout=15)
    assert chat(fleet, "c").model == "c"
    after = fleet.pod()
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert [s.get("restartCount", 0) for s in after["status"]["containerStatuses"]] == \
        [s.get("restartCount", 0) for s in before["status"]["containerStatuses"]]
    now = fleet.get("deployment", NAME)
    assert now["spec"]["template"] == deployment["spec"]["template"]
    assert now["metadata"]["generation"] == deployment["metadata"]["generation"]


def test_a_bad_folder_and_a_rank_above_the_maximum_are_degraded_with_events(fleet):
    fleet.set_adapters([{"name": "b", "source": "adapters/b"}, {"name": "junk", "source": "adapters/junk"},
                        {"name": "big", "source": "adapters/r32"}])
    entries = wait_for(lambda: (a := fleet.adapters()) and "lastError" in a.get("big", {})
                       and "lastError" in a.get("junk", {}) and a, timeout=30)
    assert "is not a PEFT adapter folder" in entries["junk"]["lastError"]
    assert "rank r=32 exceeds max_lora_rank=16" in entries["big"]["lastError"]
    assert entries["b"] == {"name": "b", "readyPods": 1} and fleet.served() == {"b"}
    degraded = wait_for(lambda: (c := next((c for c in fleet.status().get("conditions") or []
                                            if c["type"] == "Degraded"), {})).get("reason") == "AdapterFailed" and c,
                        timeout=15)
    assert degraded["status"] == "True"
    assert "adapter junk" in degraded["message"] and "adapter big" in degraded["message"]
    warnings = wait_for(lambda: len(w := fleet.events("AdapterFailed")) >= 2 and w, timeout=10)
    assert any(m.startswith("adapter junk:") for m in warnings) and any(m.startswith("adapter big:") for m in warnings)
    assert chat(fleet, "b").model == "b"                                       # the good one keeps serving
    fleet.set_adapters([{"name": "b", "source": "adapters/b"}])
    assert wait_for(lambda: next(c for c in fleet.status()["conditions"] if c["type"] == "Degraded")["reason"]
                    == "PlanFeasible", timeout=15)
