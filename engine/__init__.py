"""specfleet.engine: continuous batching over a paged KV cache, behind an offline and an HTTP API."""
from __future__ import annotations

__all__ = ["LLM", "LLMEngine", "EngineConfig", "SamplingParams", "RequestOutput"]


def __getattr__(name: str):
    # Lazy: `import specfleet.engine.config` must not pull in torch.
    if name == "LLM":
        from specfleet.engine.llm import LLM
        return LLM
    if name == "LLMEngine":
        from specfleet.engine.engine import LLMEngine
        return LLMEngine
    if name == "EngineConfig":
        from specfleet.engine.config import EngineConfig
        return EngineConfig
    if name == "SamplingParams":
        from specfleet.engine.sampling_params import SamplingParams
        return SamplingParams
    if name == "RequestOutput":
        from specfleet.engine.outputs import RequestOutput
        return RequestOutput
    raise AttributeError(name)
