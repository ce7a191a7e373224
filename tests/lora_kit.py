"""Random-weight PEFT LoRA adapters for the tiny test Llama, and transformers + peft as their reference."""
from __future__ import annotations

import functools

import torch
from transformers import AutoModelForCausalLM, GenerationConfig

# name -> (seed, LoraConfig arguments): every projection with a smaller o_proj rank, attention only with
# rslora, the MLP only at rank 16
ADAPTERS = {
    "all": (1, dict(r=8, lora_alpha=16, rank_pattern={"o_proj": 2},
                    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])),
    "qv-rslora": (2, dict(r=4, lora_alpha=8, use_rslora=True, target_modules=["q_proj", "v_proj"])),
    "mlp": (3, dict(r=16, lora_alpha=8, target_modules=["gate_proj", "up_proj", "down_proj"])),
}


def build_adapter(base: str, folder, seed: int, **lora) -> str:
    """A real PEFT folder with random A and B (peft's own init leaves B zero: no effect to test)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    get_peft_model(model, LoraConfig(init_lora_weights=False, **lora)).save_pretrained(folder)
    return str(folder)


def build_adapters(base: str, root) -> dict[str, str]:
    """Every adapter of ADAPTERS under `root`: name -> folder."""
    return {name: build_adapter(base, root / name, seed, **lora) for name, (seed, lora) in ADAPTERS.items()}


@functools.lru_cache(maxsize=4)
def _peft_model(base: str, adapter: str):
    from peft import PeftModel

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    return PeftModel.from_pretrained(model, adapter).eval()


def peft_greedy(base: str, adapter: str, prompt: list[int], max_new_tokens: int = 16) -> list[int]:
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.inference_mode():
        out = _peft_model(base, adapter).generate(input_ids=torch.tensor([prompt]), generation_config=config,
                                                  attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return out[0, len(prompt):].tolist()
