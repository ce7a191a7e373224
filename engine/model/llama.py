"""The Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) running over a paged KV cache.

Parameters keep Hugging Face names except that q/k/v and gate/up projections are fused into one
matrix each; `load_weights` splices the checkpoint's separate tensors into them. The forward takes a
flat batch of tokens (prefill chunks and decodes mixed) and never pads.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from specfleet.engine.attention import AttentionMetadata, TorchPagedAttention

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


@dataclass(frozen=True)
class LlamaShape:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    qkv_bias: bool
    qk_norm: bool
    tie_word_embeddings: bool

    @classmethod
    def from_hf(cls, config) -> "LlamaShape":
        arch = (config.architectures or ["LlamaForCausalLM"])[0]
        heads = config.num_attention_heads
        return cls(
            vocab_size=config.vocab_size, hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size, num_layers=config.num_hidden_layers,
            num_heads=heads, num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            rms_norm_eps=config.rms_norm_eps,
            qkv_bias=arch == "Qwen2ForCausalLM" or bool(getattr(config, "attention_bias", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)))


class TorchElementwise:
    """The decoder's elementwise steps in plain torch: the reference. A backend may swap in an object with
    the same four functions (`engine/cpu/fused_ops.cpp` runs these very kernels, one call per step)."""

    @staticmethod
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        return weight * x32.to(x.dtype)

    @staticmethod
    def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
        """(residual + x, rms_norm(residual + x)): the stream after a sub-layer and the next one's input."""
        total = residual + x
        return total, TorchElementwise.rms_norm(total, weight, eps)

    @staticmethod
    def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up

    @staticmethod
    def rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.ops = TorchElementwise

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.rms_norm(x, self.weight, self.eps)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding with the checkpoint's scaling (linear, llama3, yarn, ...)."""

    def __init__(self, inv_freq: torch.Tensor, scaling: float, max_positions: int) -> None:
        super().__init__()
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq.float())
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos() * scaling, persistent=False)   # [max_positions, head_dim]
        self.register_buffer("sin", emb.sin() * scaling, persistent=False)

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin for the step's positions, [tokens, 1, head_dim]; computed once, used by every layer."""
        return self.cos[positions].unsqueeze(1).to(dtype), self.sin[positions].unsqueeze(1).to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class Attention(nn.Module):
    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.shape = shape
        self.q_size = shape.num_heads * shape.head_dim
        self.kv_size = shape.num_kv_heads * shape.head_dim
        self.qkv_proj = nn.Linear(shape.hidden_size, self.q_size + 2 * self.kv_size, bias=shape.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, shape.hidden_size, bias=False)
        if shape.qk_norm:
            self.q_norm = RMSNorm(shape.head_dim, shape.rms_norm_eps)
            self.k_norm = RMSNorm(shape.head_dim, shape.rms_norm_eps)
        self.attend = TorchPagedAttention(scale=shape.head_dim ** -0.5)
        self.ops = TorchElementwise

    def forward(self, rope: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor,
                kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata) -> torch.Tensor:
        s = self.shape
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, s.num_heads, s.head_dim)
        k = k.view(-1, s.num_kv_heads, s.head_dim)
        v = v.view(-1, s.num_kv_heads, s.head_dim)
        if s.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.ops.rotary(q, k, *rope)
        self.attend.write_kv(kv_cache[0], kv_cache[1], k, v, meta.slot_mapping)
        out = self.attend(q, kv_cache[0], kv_cache[1], meta)
        return self.o_proj(out.view(-1, self.q_size))


class MLP(nn.Module):
    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(shape.hidden_size, 2 * shape.intermediate_size, bias=False)
        self.down_proj = nn.Linear(shape.intermediate_size, shape.hidden_size, bias=False)
        self.ops = TorchElementwise

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.ops.silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.self_attn = Attention(shape)
        self.mlp = MLP(shape)
        self.input_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)

    def forward(self, rope, x, residual, kv_cache, meta) -> tuple[torch.Tensor, torch.Tensor]:
        """(this layer's MLP output, the residual stream it is still to be added to). `x` is the previous
        layer's MLP output, added to the stream in this layer's input norm (one pass, not an add and a
        norm); the first layer gets the embeddings as `x` and no stream."""
        if residual is None:
            residual, normed = x, self.input_layernorm(x)
        else:
            residual, normed = add_rms_norm(self.input_layernorm, x, residual)
        residual, normed = add_rms_norm(self.post_attention_layernorm, self.self_attn(rope, normed, kv_cache, meta),
                                        residual)
        return self.mlp(normed), residual


def add_rms_norm(norm: RMSNorm, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(residual + x, norm(residual + x)) through the norm's elementwise ops."""
    return norm.ops.add_rms_norm(x, residual, norm.weight, norm.eps)


class LlamaModel(nn.Module):
    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(shape) for _ in range(shape.num_layers))
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    # checkpoint name fragment -> (fused parameter fragment, shard index)
    FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
             "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}

    def __init__(self, shape: LlamaShape, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.shape = shape
        self.rotary = rotary
        self.model = LlamaModel(shape)
        self.lm_head = nn.Linear(shape.hidden_size, shape.vocab_size, bias=False)
        if shape.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)
        rope = self.rotary.tables(positions, x.dtype)
        residual = None
        for layer, kv_cache in zip(self.model.layers, kv_caches):
            x, residual = layer(rope, x, residual, kv_cache, meta)
        return add_rms_norm(self.model.norm, x, residual)[1]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def set_attention_backend(self, factory) -> None:
        for layer in self.model.layers:
            layer.self_attn.attend = factory(self.shape.head_dim ** -0.5)

    def set_elementwise(self, ops) -> None:
        """Route RMSNorm, residual + RMSNorm, SiLU-and-mul and RoPE through `ops` (see TorchElementwise)."""
        for module in self.modules():
            if isinstance(module, (RMSNorm, Attention, MLP)):
                module.ops = ops

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            if "rotary_emb" in name or (name == "lm_head.weight" and self.shape.tie_word_embeddings):
                continue
            target, shard = self._fused_target(name)
            if target not in params:
                raise ValueError(f"checkpoint tensor {name!r} has no place in the model")
            self._copy_into(params[target], tensor, shard, target)
            loaded.add(target)
        missing = set(params) - loaded - ({"lm_head.weight"} if self.shape.tie_word_embeddings else set())
        if missing:
            raise ValueError(f"checkpoint lacks tensors: {sorted(missing)[:5]}")

    def _fused_target(self, name: str) -> tuple[str, int | None]:
        for part, (fused, shard) in self.FUSED.items():
            if f".{part}." in name:
                return name.replace(part, fused), shard
        return name, None

    def _copy_into(self, param: torch.Tensor, tensor: torch.Tensor, shard: int | None, name: str) -> None:
        if shard is None:
            param.data.copy_(tensor)
            return
        sizes = self._shard_sizes(name)
        offset = sum(sizes[:shard])
        param.data[offset:offset + sizes[shard]].copy_(tensor)

    def _shard_sizes(self, name: str) -> list[int]:
        s = self.shape
        if "qkv_proj" in name:
            return [s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim, s.num_kv_heads * s.head_dim]
        return [s.intermediate_size, s.intermediate_size]
