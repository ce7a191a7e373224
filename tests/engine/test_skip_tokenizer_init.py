"""`skip_tokenizer_init=True` (vLLM's flag): a model folder without a tokenizer serves token-id prompts."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from specfleet.engine import LLM, SamplingParams

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


@pytest.fixture(scope="module")
def bare_model(tiny_llama, tmp_path_factory) -> str:
    """The tiny Llama's folder with its tokenizer files left out: config, generation config, weights."""
    folder = tmp_path_factory.mktemp("no-tokenizer")
    for file in Path(tiny_llama).iterdir():
        if file.name not in TOKENIZER_FILES:
            shutil.copy(file, folder / file.name)
    return str(folder)


def test_a_folder_without_a_tokenizer_is_refused_by_default(bare_model):
    with pytest.raises((OSError, ValueError)):
        LLM(bare_model, num_kv_blocks=32)


def test_token_id_prompts_generate_the_same_tokens_without_a_tokenizer(bare_model, tiny_llama):
    prompts = [[5, 17, 42, 99], [7, 8, 9]]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    bare = LLM(bare_model, num_kv_blocks=32, skip_tokenizer_init=True)
    assert bare.tokenizer is None
    outputs = bare.generate(prompts, params)
    reference = LLM(tiny_llama, num_kv_blocks=32).generate(prompts, params)
    assert [o.token_ids for o in outputs] == [r.token_ids for r in reference]
    assert all(len(o.token_ids) == 6 and o.text == "" and o.finished for o in outputs)
    assert [o.prompt_token_ids for o in outputs] == prompts


def test_text_prompts_and_stop_strings_are_refused_without_a_tokenizer(bare_model):
    llm = LLM(bare_model, num_kv_blocks=32, skip_tokenizer_init=True)
    with pytest.raises(ValueError, match="token ids"):
        llm.generate("hello")
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        llm.generate([[5, 6, 7], [8, 9]], [SamplingParams(max_tokens=2), SamplingParams(max_tokens=2, stop=["x"])])
    assert not llm.engine.has_unfinished()              # refused all-or-nothing: the first was not queued
    greedy = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    second = llm.generate([5, 6, 7], greedy)[0].token_ids[1]
    stopped = llm.generate([5, 6, 7], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True,
                                                      stop_token_ids=[second]))[0]
    assert stopped.finish_reason == "stop" and stopped.token_ids[-1] == second and len(stopped.token_ids) <= 2
