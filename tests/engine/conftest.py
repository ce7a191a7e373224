"""Engine test fixtures: greedy references from transformers `generate()` and mixed-length prompts."""
from __future__ import annotations

import functools

import pytest
import torch
from transformers import GenerationConfig


@functools.lru_cache(maxsize=8)
def _hf_model(path: str):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None       # generate exactly max_new_tokens, like ignore_eos
    return model


def hf_greedy(path: str, prompt: list[int], max_new_tokens: int) -> list[int]:
    model = _hf_model(path)
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), generation_config=config,
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return out[0, len(prompt):].tolist()


def mixed_prompts(n: int, vocab: int = 400, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 70, (n,), generator=gen).tolist()
    return [torch.randint(3, vocab, (length,), generator=gen).tolist() for length in lengths]


@pytest.fixture(name="hf_greedy", scope="session")
def _hf_greedy_fixture():
    return hf_greedy


@pytest.fixture(name="mixed_prompts", scope="session")
def _mixed_prompts_fixture():
    return mixed_prompts
