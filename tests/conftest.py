"""Shared fixtures: tiny random-weight models in the real Hugging Face layout."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session", autouse=True)
def _single_thread_torch():
    # Tiny models run faster on one thread, and two test workers must not fight over two cores.
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory):
    """Build (once per session and configuration) a random-weight model folder."""
    from specfleet.engine.tiny_model import build_tiny_model

    built: dict[tuple, str] = {}

    def make(arch: str = "llama", **kwargs) -> str:
        key = (arch, repr(sorted(kwargs.items())))
        if key not in built:
            built[key] = str(build_tiny_model(tmp_path_factory.mktemp(f"tiny-{arch}"), arch, **kwargs))
        return built[key]

    return make


@pytest.fixture(scope="session")
def tiny_llama(tiny_model_factory) -> str:
    return tiny_model_factory("llama")
