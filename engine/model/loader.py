"""Load a Hugging Face model folder (config.json, *.safetensors, tokenizer) into our model code."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from specfleet.engine.model.llama import SUPPORTED_ARCHITECTURES, LlamaForCausalLM, LlamaShape, RotaryEmbedding


@dataclass
class LoadedModel:
    model: LlamaForCausalLM
    path: Path
    eos_token_ids: set[int]
    max_position_embeddings: int


def resolve_model_path(model: str) -> Path:
    """A local folder, or the name of a built-in model (converted and cached on first use)."""
    from specfleet.engine import builtin

    if model in builtin.BUILTIN_MODELS:
        return builtin.ensure_builtin(model)
    path = Path(model).expanduser()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"model {model!r} is not a Hugging Face model folder (no config.json there) nor a built-in "
            f"model ({', '.join(builtin.BUILTIN_MODELS)})")
    return path


def read_config(path: Path):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    arch = (getattr(config, "architectures", None) or ["?"])[0]
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"unsupported architecture {arch!r} in {path}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    return config


def max_context(config) -> int:
    """The context the model handles exactly: position limit, and the sliding window if it is smaller."""
    limit = config.max_position_embeddings
    window = getattr(config, "sliding_window", None)
    if window and getattr(config, "use_sliding_window", True):
        limit = min(limit, window)
    return limit


def rotary_for(config, max_positions: int) -> RotaryEmbedding:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = getattr(config, "rope_parameters", None) or {"rope_type": "default", "rope_theta": config.rope_theta}
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        inv_freq = 1.0 / (params["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        scaling = 1.0
    else:
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"))
    return RotaryEmbedding(inv_freq, scaling, max_positions)


def eos_ids(path: Path, config) -> set[int]:
    from transformers import GenerationConfig

    ids = getattr(config, "eos_token_id", None)
    try:
        ids = GenerationConfig.from_pretrained(path).eos_token_id or ids
    except OSError:
        pass
    if ids is None:
        return set()
    return {ids} if isinstance(ids, int) else set(ids)


def safetensor_weights(path: Path, dtype: torch.dtype):
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}")
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name).to(dtype)


def load_model(model: str, dtype: torch.dtype, device: torch.device, max_positions: int | None = None) -> LoadedModel:
    path = resolve_model_path(model)
    config = read_config(path)
    limit = max_context(config)
    positions = min(max_positions or limit, limit)
    with torch.device(device):
        net = LlamaForCausalLM(LlamaShape.from_hf(config), rotary_for(config, positions)).to(dtype)
    net.load_weights(safetensor_weights(path, dtype))
    net.eval().requires_grad_(False)
    return LoadedModel(net, path, eos_ids(path, config), limit)
