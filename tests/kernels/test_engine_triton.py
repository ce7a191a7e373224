"""The engine with the triton backend forced (interpreted on CPU) still equals transformers greedy.

A representative subset of tests/engine/test_correctness.py; the whole engine suite runs on this
backend with SPECFLEET_ATTENTION_BACKEND=triton (see docs/kernels.md).
"""
from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from specfleet.engine import LLM, SamplingParams
from specfleet.engine.kernels.backend import TritonPagedAttention

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def hf_greedy(path: str, prompt: list[int], max_new_tokens: int) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), generation_config=config,
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return out[0, len(prompt):].tolist()


def prompts(n: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 50, (n,), generator=gen).tolist()
    return [torch.randint(3, 400, (length,), generator=gen).tolist() for length in lengths]


def triton_llm(path: str, **flags) -> LLM:
    llm = LLM(path, attention_backend="triton", **flags)
    assert isinstance(llm.engine.runner.model.model.layers[0].self_attn.attend, TritonPagedAttention)
    return llm


def test_mixed_batch_with_chunked_prefill_matches_transformers(tiny_llama):
    batch = prompts(4, seed=1)
    llm = triton_llm(tiny_llama, num_kv_blocks=64, block_size=8, max_num_batched_tokens=40)
    for prompt, out in zip(batch, llm.generate(batch, GREEDY)):
        assert out.token_ids == hf_greedy(tiny_llama, prompt, GREEDY.max_tokens)


def test_prefix_cache_hits_read_cached_blocks_through_the_table(tiny_llama):
    shared = list(range(10, 45))
    batch = [shared + [70 + i, 80 + i] for i in range(3)]
    llm = triton_llm(tiny_llama, num_kv_blocks=64, block_size=8)
    first = llm.generate(batch[:1], GREEDY)
    rest = llm.generate(batch[1:], GREEDY)
    assert all(out.num_cached_tokens == 32 for out in rest)
    for prompt, out in zip(batch, first + rest):
        assert out.token_ids == hf_greedy(tiny_llama, prompt, GREEDY.max_tokens)


def test_triton_and_torch_backends_agree_under_preemption(tiny_llama):
    batch = prompts(6, seed=4)
    flags = dict(num_kv_blocks=12, block_size=8, max_num_seqs=6)
    llm = triton_llm(tiny_llama, **flags)
    triton_out = llm.generate(batch, GREEDY)
    assert llm.engine.stats.preemptions > 0
    torch_out = LLM(tiny_llama, attention_backend="torch", **flags).generate(batch, GREEDY)
    assert [o.token_ids for o in triton_out] == [o.token_ids for o in torch_out]
