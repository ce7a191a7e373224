"""Greedy outputs must equal transformers `generate()` token for token, whatever the scheduling."""
from __future__ import annotations

import pytest

from specfleet.engine import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture
def assert_matches_reference(hf_greedy):
    def check(path: str, prompts, outputs, max_tokens: int = 24) -> None:
        for prompt, out in zip(prompts, outputs):
            assert out.token_ids == hf_greedy(path, prompt, max_tokens), f"prompt of {len(prompt)} tokens diverged"
    return check


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize("prefix_caching", [True, False])
@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_batch_of_mixed_lengths_matches_transformers(tiny_model_factory, arch, prefix_caching, backend,
                                                     assert_matches_reference, mixed_prompts):
    path = tiny_model_factory(arch)
    prompts = mixed_prompts(6, seed=1)
    llm = LLM(path, num_kv_blocks=128, enable_prefix_caching=prefix_caching, attention_backend=backend)
    assert_matches_reference(path, prompts, llm.generate(prompts, GREEDY))


def test_tied_embeddings_match_transformers(tiny_model_factory, assert_matches_reference, mixed_prompts):
    path = tiny_model_factory("llama", tie_word_embeddings=True)
    prompts = mixed_prompts(3, seed=2)
    assert_matches_reference(path, prompts, LLM(path, num_kv_blocks=64).generate(prompts, GREEDY))


def test_rope_scaling_matches_transformers(tiny_model_factory, assert_matches_reference, mixed_prompts):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 256, "rope_theta": 10000.0}
    path = tiny_model_factory("llama", rope_parameters=scaling)
    prompts = mixed_prompts(3, seed=3)
    assert_matches_reference(path, prompts, LLM(path, num_kv_blocks=64).generate(prompts, GREEDY))


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_small_pool_forces_preemption_without_changing_outputs(tiny_llama, backend, assert_matches_reference,
                                                               mixed_prompts):
    prompts = mixed_prompts(8, seed=4)
    llm = LLM(tiny_llama, num_kv_blocks=14, block_size=8, max_num_seqs=8, attention_backend=backend)
    outputs = llm.generate(prompts, GREEDY)
    assert llm.engine.stats.preemptions > 0
    assert_matches_reference(tiny_llama, prompts, outputs)


def test_chunked_prefill_with_tiny_token_budget_matches(tiny_llama, assert_matches_reference, mixed_prompts):
    prompts = mixed_prompts(5, seed=5)
    llm = LLM(tiny_llama, num_kv_blocks=128, max_num_batched_tokens=7)
    assert_matches_reference(tiny_llama, prompts, llm.generate(prompts, GREEDY))


def test_prefix_cache_hits_on_shared_prefix_and_outputs_still_match(tiny_llama, assert_matches_reference):
    shared = list(range(10, 60))
    prompts = [shared + [70 + i, 80 + i] for i in range(4)]
    llm = LLM(tiny_llama, num_kv_blocks=128, block_size=8)
    first = llm.generate(prompts[:1], GREEDY)
    rest = llm.generate(prompts[1:], GREEDY)
    assert first[0].num_cached_tokens == 0
    assert all(out.num_cached_tokens == 48 for out in rest)     # 6 full blocks of the shared 50 tokens
    assert_matches_reference(tiny_llama, prompts, first + rest)


def test_whole_prompt_cached_still_recomputes_last_token(tiny_llama):
    prompt = list(range(10, 42))                                   # exactly 4 blocks of 8
    llm = LLM(tiny_llama, num_kv_blocks=64, block_size=8)
    a = llm.generate([prompt], GREEDY)[0]
    b = llm.generate([prompt], GREEDY)[0]
    assert b.num_cached_tokens == 24 and a.token_ids == b.token_ids


def test_text_prompts_and_decoding(tiny_llama, hf_greedy):
    llm = LLM(tiny_llama, num_kv_blocks=64)
    out = llm.generate("The quick brown fox", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0]
    ids = llm.tokenizer.encode("The quick brown fox")
    assert out.prompt_token_ids == ids
    assert out.token_ids == hf_greedy(tiny_llama, ids, 8)
    assert out.text == llm.tokenizer.decode(out.token_ids, skip_special_tokens=True)
