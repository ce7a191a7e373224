"""Read a PEFT LoRA folder (adapter_config.json + adapter_model.safetensors) and validate it for the base model.

The result holds, per (layer, projection), A [r, in] and B [out, r] with the adapter's scaling already
folded into B (lora_alpha / r, or lora_alpha / sqrt(r) with rslora; r per module, so a rank_pattern is
honoured). Projections keep Hugging Face names (q_proj, ..., down_proj); where the model fuses them
(qkv_proj, gate_up_proj) `layers.py` stacks the parts. Anything the engine cannot apply exactly is
refused with a `LoRAError` that names the problem, never silently dropped.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from specfleet.engine.model.llama import LlamaShape

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
# base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight (an adapter-name infix is tolerated)
_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.[\w-]+)?\.weight$")
# Options that change the math beyond B @ A: applying the adapter without them would be silently wrong.
_UNSUPPORTED = {"use_dora": "DoRA", "modules_to_save": "modules_to_save", "alpha_pattern": "alpha_pattern",
                "fan_in_fan_out": "fan_in_fan_out", "lora_bias": "LoRA bias", "layer_replication": "layer_replication"}


class LoRAError(ValueError):
    """An adapter that cannot be served on this model; the message names the problem."""


@dataclass
class LoRAAdapter:
    path: Path
    rank: int                                                  # the largest module rank
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]   # (layer, projection) -> (A, B * scaling)


def projection_dims(shape: LlamaShape) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each adaptable projection, unfused."""
    q, kv = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    h, i = shape.hidden_size, shape.intermediate_size
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def load_adapter(path: str | Path, shape: LlamaShape, max_rank: int, base_names: tuple[str, ...] = ()) -> LoRAAdapter:
    """The adapter at `path`, validated against `shape` and `max_rank`; `base_names` are the names and paths the
    served base model goes by (checked against the adapter's base_model_name_or_path when it names one)."""
    folder = Path(path).expanduser()
    config = read_config(folder)
    check_config(config, max_rank, base_names)
    pairs = pair_tensors(read_tensors(folder), shape.num_layers)
    check_shapes(pairs, projection_dims(shape), max_rank)
    alpha, rslora = float(config.get("lora_alpha", config["r"])), bool(config.get("use_rslora"))
    weights = {key: (a, b * (alpha / (math.sqrt(a.shape[0]) if rslora else a.shape[0])))
               for key, (a, b) in pairs.items()}
    return LoRAAdapter(folder, max(a.shape[0] for a, _ in pairs.values()), weights)


def read_config(folder: Path) -> dict:
    if not (folder / CONFIG_FILE).is_file():
        raise LoRAError(f"{folder} is not a PEFT adapter folder (no {CONFIG_FILE})")
    try:
        config = json.loads((folder / CONFIG_FILE).read_text())
    except json.JSONDecodeError as e:
        raise LoRAError(f"{folder / CONFIG_FILE} is not valid JSON: {e}") from None
    if config.get("peft_type", "LORA") != "LORA":
        raise LoRAError(f"{folder} holds a {config['peft_type']} adapter; only LORA adapters are served")
    if not isinstance(config.get("r"), int) or config["r"] < 1:
        raise LoRAError(f"{folder / CONFIG_FILE} has no valid rank r (got {config.get('r')!r})")
    return config


def check_config(config: dict, max_rank: int, base_names: tuple[str, ...]) -> None:
    if config["r"] > max_rank:
        raise LoRAError(f"adapter rank r={config['r']} exceeds max_lora_rank={max_rank}")
    for key, name in _UNSUPPORTED.items():
        if config.get(key):
            raise LoRAError(f"adapter uses {name} ({key}={config[key]!r}), which the engine does not support")
    if config.get("bias", "none") != "none":
        raise LoRAError(f"adapter trains biases (bias={config['bias']!r}), which the engine does not support")
    targets = config.get("target_modules")
    if isinstance(targets, list) and set(targets) - set(PROJECTIONS):
        raise LoRAError(f"adapter targets modules the model has no LoRA slot for: "
                        f"{sorted(set(targets) - set(PROJECTIONS))} (supported: {', '.join(PROJECTIONS)})")
    base = config.get("base_model_name_or_path")
    if base and base_names and not any(same_model(base, name) for name in base_names):
        raise LoRAError(f"adapter was trained on {base!r}, but the engine serves {base_names[0]!r}")


def same_model(a: str, b: str) -> bool:
    """Two names or paths of one model: equal folders, or equal last path components (a hub id's name
    against the folder it was downloaded to), case-insensitively."""
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    if pa.exists() and pb.exists():
        return pa.resolve() == pb.resolve()
    return pa.name.lower() == pb.name.lower()


def read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    file = folder / WEIGHTS_FILE
    if not file.is_file():
        other = " (adapter_model.bin is not read: save with safe_serialization=True)" \
            if (folder / "adapter_model.bin").is_file() else ""
        raise LoRAError(f"{folder} is not a PEFT adapter folder (no {WEIGHTS_FILE}){other}")
    with safe_open(str(file), framework="pt") as f:
        return {name: f.get_tensor(name).float() for name in f.keys()}


def pair_tensors(tensors: dict[str, torch.Tensor], num_layers: int) -> dict[tuple[int, str], tuple[torch.Tensor, ...]]:
    """(layer, projection) -> (A, B), refusing tensors of modules the model lacks."""
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        match = _KEY.search(name)
        if match is None or match[2] not in PROJECTIONS:
            raise LoRAError(f"adapter tensor {name!r} is for a module the model has no LoRA slot for "
                            f"(supported: {', '.join(PROJECTIONS)} in layers 0..{num_layers - 1})")
        layer = int(match[1])
        if layer >= num_layers:
            raise LoRAError(f"adapter tensor {name!r} is for layer {layer}; the model has {num_layers} layers")
        halves.setdefault((layer, match[2]), {})[match[3]] = tensor
    if not halves:
        raise LoRAError("adapter holds no LoRA tensors")
    for (layer, proj), pair in halves.items():
        if set(pair) != {"A", "B"}:
            raise LoRAError(f"layer {layer} {proj} has lora_{''.join(pair)} but not both lora_A and lora_B")
    return {key: (pair["A"], pair["B"]) for key, pair in halves.items()}


def check_shapes(pairs: dict, dims: dict[str, tuple[int, int]], max_rank: int) -> None:
    for (layer, proj), (a, b) in pairs.items():
        fan_in, fan_out = dims[proj]
        r = a.shape[0]
        if a.dim() != 2 or b.dim() != 2 or a.shape[1] != fan_in or b.shape != (fan_out, r):
            raise LoRAError(f"layer {layer} {proj}: lora_A is {tuple(a.shape)} and lora_B {tuple(b.shape)}, "
                            f"expected ({r}, {fan_in}) and ({fan_out}, {r}) for this model")
        if r > max_rank:
            raise LoRAError(f"layer {layer} {proj} has rank {r}, above max_lora_rank={max_rank}")
