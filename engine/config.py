"""EngineConfig: every engine flag in one dataclass, validated once at start-up.

Names mirror vLLM's flags (`--max-num-seqs` is `max_num_seqs`) so the operator can render either
runtime from one plan.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

SpeculativeMethod = Literal["ngram", "draft"]


@dataclass
class EngineConfig:
    model: str
    served_model_name: str | None = None
    block_size: int = 16
    num_kv_blocks: int | None = None          # None: size the pool from memory
    gpu_memory_utilization: float = 0.90      # share of device memory for weights + KV on CUDA
    cpu_kv_cache_gib: float = 1.0             # KV pool size on CPU when num_kv_blocks is None
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None          # None: the model's max_position_embeddings
    enable_prefix_caching: bool = True
    dtype: str = "auto"                       # auto: bf16 on CUDA, fp32 on CPU
    # No tokenizer is loaded (vLLM's flag): prompts must be token ids, outputs carry token ids and empty
    # text, and stop strings are refused. For model folders that ship without a tokenizer.
    skip_tokenizer_init: bool = False
    device: str = "auto"
    # auto: triton on CUDA, the C++ kernel on CPU (torch if it cannot be built); torch: the reference path.
    # SPECFLEET_ATTENTION_BACKEND=triton (with TRITON_INTERPRET=1 on CPU) runs any suite on the kernels.
    attention_backend: Literal["auto", "torch", "cpu", "triton"] = field(
        default_factory=lambda: os.environ.get("SPECFLEET_ATTENTION_BACKEND", "auto"))
    seed: int = 0
    free_block_watermark: float = 0.01        # share of blocks admission keeps free for running decodes
    max_waiting_requests: int = 1024          # queued beyond the free running slots; past it: 429
    # Deadline order for waiting prompts (arrival + this TTFT target): those that can still make it
    # first, late ones after them; None keeps arrival order. The operator passes the service's TTFT SLO.
    ttft_deadline_ms: float | None = None
    # The service's inter-token latency target: a request meets its SLO when its TTFT is within
    # ttft_deadline_ms and its mean time per output token within this (specfleet:requests_slo_met_total).
    itl_target_ms: float | None = None
    speculative_method: SpeculativeMethod | None = None
    draft_model: str | None = None
    num_speculative_tokens: int = 0
    max_speculative_tokens: int = 0     # the live switch's ceiling on k (0: num_speculative_tokens)
    speculation_enabled: bool = True
    ngram_min: int = 2                  # the n-gram proposer matches suffixes of ngram_max down to ngram_min
    ngram_max: int = 4                  # tokens (vLLM's prompt_lookup_min / prompt_lookup_max)
    # Multi-LoRA (vLLM's flags): up to max_loras adapters in one step, each of rank <= max_lora_rank; at most
    # max_cpu_loras (default max_loras) kept loaded on CPU. Off: the model runs without any LoRA op.
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    # Where https:// and oci:// adapters are fetched to (None: ~/.cache/specfleet/lora), and the registries
    # (host or host:port) reached over plain http besides localhost.
    lora_cache_dir: str | None = None
    lora_insecure_registries: tuple[str, ...] = ()
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._check_positive("block_size", "max_num_seqs", "max_num_batched_tokens")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.attention_backend not in ("auto", "torch", "cpu", "triton"):
            raise ValueError(f"attention_backend must be auto, torch, cpu or triton, got {self.attention_backend!r}")
        if self.max_waiting_requests < 0:
            raise ValueError(f"max_waiting_requests must be >= 0, got {self.max_waiting_requests}")
        if self.itl_target_ms is not None and self.itl_target_ms <= 0:
            raise ValueError(f"itl_target_ms must be > 0, got {self.itl_target_ms}")
        if self.ttft_deadline_ms is not None and self.ttft_deadline_ms <= 0:
            raise ValueError(f"ttft_deadline_ms must be > 0, got {self.ttft_deadline_ms}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min} and {self.ngram_max}")
        if self.speculative_method not in (None, "ngram", "draft"):
            raise ValueError(f"speculative_method must be ngram or draft, got {self.speculative_method!r}")
        if self.speculative_method == "draft" and not self.draft_model:
            raise ValueError("speculative_method='draft' needs draft_model")
        if self.num_speculative_tokens < 0:
            raise ValueError(f"num_speculative_tokens must be >= 0, got {self.num_speculative_tokens}")
        if self.speculative_method and self.num_speculative_tokens == 0:
            self.num_speculative_tokens = 4
        if self.max_speculative_tokens and self.max_speculative_tokens < self.num_speculative_tokens:
            raise ValueError(f"max_speculative_tokens ({self.max_speculative_tokens}) must be >= "
                             f"num_speculative_tokens ({self.num_speculative_tokens})")
        self._check_lora()

    def _check_lora(self) -> None:
        self._check_positive("max_loras", "max_lora_rank")
        if self.max_cpu_loras is None:
            self.max_cpu_loras = self.max_loras
        if self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})")
        if self.enable_lora and self.speculative_method == "draft":
            raise ValueError("enable_lora cannot be combined with speculative_method='draft': the draft model has "
                             "no adapters, so its drafts would be verified against a different model (use 'ngram')")

    def _check_positive(self, *names: str) -> None:
        for name in names:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
