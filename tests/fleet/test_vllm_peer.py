"""How the local node agent runs a rendered `vllm serve` container on a vLLM venv of this machine
(`cluster/node_agent/vllm_peer.py`); the real run is test_vllm_runtime_e2e.py."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from specfleet.cluster.node_agent import vllm_peer
from specfleet.cluster.node_agent import volumes as vol

CONTAINER = {"command": ["vllm", "serve"],
             "args": ["HuggingFaceTB/SmolLM2-135M-Instruct", "--served-model-name", "smollm2-135m", "--port", "8000",
                      "--block-size", "32"],
             "resources": {"requests": {"cpu": "2", "memory": "4Gi"}}}


@pytest.fixture
def peer(tmp_path, monkeypatch) -> Path:
    """A vLLM venv's layout: bin/vllm, bin/python, lib/libiomp5.so (empty files are enough here)."""
    for name in ("bin/vllm", "bin/python", "lib/libiomp5.so"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("#!/bin/sh\n")
    monkeypatch.setenv(vllm_peer.BIN_ENV, str(tmp_path / "bin/vllm"))
    return tmp_path


def test_vllm_serve_runs_the_peer_s_server_module_on_the_local_model_and_the_pod_address(peer):
    model = vllm_peer.builtin_model(CONTAINER)
    assert model == ("smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct")
    argv = vllm_peer.container_argv(CONTAINER, [], "127.0.0.9", {model[1]: "/cache/models/smollm2-135m"})
    assert argv == [str(peer / "bin/python"), "-m", "vllm.entrypoints.openai.api_server",
                    "--model", "/cache/models/smollm2-135m", "--served-model-name", "smollm2-135m",
                    "--port", "8000", "--block-size", "32", "--host", "127.0.0.9"]


def test_a_model_under_a_volume_is_translated_like_any_path(peer):
    container = {**CONTAINER, "args": ["/models/model", "--host=0.0.0.0"]}
    argv = vllm_peer.container_argv(container, [("/models/model", "/data/llama")], "127.0.0.9", {})
    assert argv[3:] == ["--model", "/data/llama", "--host=0.0.0.0"]
    assert vllm_peer.builtin_model(container) is None


def test_the_peer_s_env_is_the_cpu_backend_bound_to_the_requested_cores_without_a_kv_override(peer, tmp_path):
    env = vllm_peer.runtime_env(CONTAINER, tmp_path / "cache")
    cores = min(2, os.cpu_count() or 1)
    assert env["VLLM_TARGET_DEVICE"] == "cpu" and env["VLLM_CPU_OMP_THREADS_BIND"] == f"0-{cores - 1}"
    assert env["LD_PRELOAD"] == str(peer / "lib/libiomp5.so") and env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_CACHE_ROOT"].startswith(str(tmp_path / "cache"))
    assert "VLLM_CPU_KVCACHE_SPACE" not in env     # the renderer's --kv-cache-memory-bytes decides the pool


def test_without_a_vllm_on_this_machine_the_container_cannot_start(tmp_path, monkeypatch):
    monkeypatch.delenv(vllm_peer.BIN_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert vllm_peer.find_vllm() is None
    with pytest.raises(vol.PodConfigError) as caught:
        vllm_peer.container_argv(CONTAINER, [], "127.0.0.9", {})
    assert caught.value.reason == "CreateContainerError" and vllm_peer.BIN_ENV in str(caught.value)
    assert not vllm_peer.is_vllm_serve({"command": ["specfleet", "engine", "serve"]})
