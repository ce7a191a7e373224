"""specfleet.engine: continuous batching over a paged KV cache, behind an offline and an HTTP API.

The public names (`from specfleet.engine import LLM, SamplingParams`, as in vLLM) are re-exported lazily
(PEP 562), so `import specfleet.engine.config` or `.builtin` does not pull in torch.
"""
from __future__ import annotations

import importlib

_EXPORTS = {"LLM": "llm", "LLMEngine": "engine", "EngineConfig": "config", "SamplingParams": "sampling_params",
            "RequestOutput": "outputs", "LoRARequest": "lora.request"}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'specfleet.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(f"specfleet.engine.{_EXPORTS[name]}"), name)
