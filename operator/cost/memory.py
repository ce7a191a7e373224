"""What a replica's memory holds: weights, the activation reserve, and the KV pool in blocks.

    weights      = parameters x bytes(dtype)
    kv_per_token = 2 x layers x kv_heads x head_dim x bytes(kv_dtype)
    KV pool      = GPU memory x utilization x TP - weights - activation reserve
"""
from __future__ import annotations

from specfleet.operator.cost.shapes import Architecture

GiB = 1024 ** 3


def weights_bytes(model: Architecture) -> float:
    return model.parameters * model.dtype_bytes


def kv_bytes_per_token(model: Architecture) -> int:
    return 2 * model.num_layers * model.num_kv_heads * model.head_dim * model.kv_dtype_bytes


def activation_reserve_bytes(model: Architecture, tp: int, per_gpu_overhead: float = 1 * GiB,
                             token_budget: int = 8192) -> float:
    """Memory kept out of the KV pool: runtime overhead per GPU plus activations of one full step."""
    per_token = (2 * model.hidden_size + model.intermediate_size) * model.dtype_bytes
    logits = 4 * model.vocab_size * 256
    return tp * per_gpu_overhead + token_budget * per_token + logits


def kv_pool_bytes(model: Architecture, gpu_memory: float, utilization: float, tp: int,
                  reserve: float | None = None) -> float:
    """KV cache pool of a replica of `tp` GPUs; negative when the weights do not fit."""
    reserve = activation_reserve_bytes(model, tp) if reserve is None else reserve
    return gpu_memory * utilization * tp - weights_bytes(model) - reserve


def kv_blocks(pool_bytes: float, block_size: int, kv_per_token: int) -> int:
    """Whole KV blocks in a pool (0 when the pool is empty or negative)."""
    return max(0, int(pool_bytes // (block_size * kv_per_token)))


def lora_slot_bytes(shape: Architecture, max_loras: int, max_rank: int) -> int:
    """Memory of the engine's adapter slots: per slot and layer, each projection's A [r, in] and B [r, out] at
    the maximum rank, laid out as the engine holds them (engine/lora/layers.py: q, k, v stacked along the
    rank against the fused qkv output, gate and up against gate_up), in the model's dtype."""
    h, i = shape.hidden_size, shape.intermediate_size
    q, kv = shape.num_attention_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    fused = ((3, h, q + 2 * kv), (1, q, h), (2, h, 2 * i), (1, i, h))     # (parts, in, out): qkv, o, gate_up, down
    per_layer = sum(parts * max_rank * (fan_in + fan_out) for parts, fan_in, fan_out in fused)
    return max_loras * shape.num_layers * per_layer * shape.dtype_bytes
