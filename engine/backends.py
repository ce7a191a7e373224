"""Chooses the compute backend a loaded model runs with: triton kernels on CUDA, the C++ kernel and
oneDNN-packed linears on CPU, or the plain-torch reference path (`attention_backend="torch"`)."""
from __future__ import annotations

import torch

from specfleet.engine.model.llama import LlamaForCausalLM


def prepare_backend(model: LlamaForCausalLM, backend: str, device: torch.device) -> None:
    if backend == "triton" or (backend == "auto" and device.type == "cuda"):
        from specfleet.engine.kernels.backend import TritonPagedAttention

        model.set_attention_backend(TritonPagedAttention)
    elif device.type == "cpu":
        from specfleet.engine.cpu.backend import prepare_model

        prepare_model(model, backend)
