"""Engine behaviour: block accounting, bad input, abort, stop rules, sampling controls."""
from __future__ import annotations

import pytest

from specfleet.engine import LLM, SamplingParams
from specfleet.engine.config import EngineConfig


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(tiny_llama, num_kv_blocks=96, block_size=8, max_num_seqs=16)


def assert_all_blocks_free(llm) -> None:
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    assert all(b.ref_count == 0 for b in bm.blocks)


def test_every_block_is_free_after_requests_end(llm, mixed_prompts):
    llm.generate(mixed_prompts(12, seed=7), SamplingParams(temperature=0.8, max_tokens=20, seed=3))
    assert_all_blocks_free(llm)


@pytest.mark.parametrize("prompt, params, message", [
    ("", None, "prompt is empty"),
    ([1] * 5000, None, "model's context"),
    ([10**7], None, "token ids"),
])
def test_bad_requests_raise_clear_errors_and_the_engine_keeps_serving(llm, prompt, params, message):
    engine = llm.engine
    engine.add_request("good", [5, 6, 7], SamplingParams(temperature=0, max_tokens=4))
    with pytest.raises(ValueError, match=message):
        engine.add_request("bad", prompt, params)
    done = []
    while engine.has_unfinished():
        done += [o for o in engine.step() if o.finished]
    assert [o.request_id for o in done] == ["good"] and len(done[0].token_ids) == 4
    assert_all_blocks_free(llm)


def test_invalid_sampling_params_are_rejected():
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)


def test_unknown_model_folder_and_unsupported_architecture(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a Hugging Face model folder"):
        LLM(str(tmp_path / "nope"))
    (tmp_path / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}')
    with pytest.raises(ValueError, match="unsupported architecture 'GPT2LMHeadModel'"):
        LLM(str(tmp_path))


def test_abort_frees_the_sequence_at_once(llm):
    engine = llm.engine
    engine.add_request("x", list(range(3, 40)), SamplingParams(max_tokens=50))
    engine.step()
    out = engine.abort("x")
    assert out.finish_reason == "abort" and not engine.has_unfinished()
    assert_all_blocks_free(llm)


def test_stop_token_and_stop_string_and_eos(llm):
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    base = llm.generate([[5, 6, 7]], greedy)[0]
    stop_tok = base.token_ids[3]
    first = base.token_ids.index(stop_tok)
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop_tok]))[0]
    assert out.token_ids == base.token_ids[:first + 1] and out.finish_reason == "stop" and out.stop_reason == stop_tok
    stop_text = base.text[len(base.text) // 2:][:3]
    if stop_text.strip():
        out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=12, stop=[stop_text], ignore_eos=True))[0]
        assert out.finish_reason == "stop" and stop_text not in out.text and base.text.startswith(out.text)


def test_seeded_sampling_is_reproducible_whatever_the_batch(llm, mixed_prompts):
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_tokens=16, seed=1234, ignore_eos=True)
    alone = llm.generate([[5, 6, 7]], params)[0].token_ids
    others = SamplingParams(temperature=1.0, max_tokens=16)
    batched = llm.generate([[5, 6, 7]] + mixed_prompts(4, seed=8), [params] + [others] * 4)[0].token_ids
    assert alone == batched


def test_top_k_one_is_greedy_and_logprobs_are_reported(llm):
    greedy = llm.generate([[9, 8, 7]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0]
    top1 = llm.generate([[9, 8, 7]], SamplingParams(temperature=1.5, top_k=1, max_tokens=8, ignore_eos=True,
                                                    logprobs=2))[0]
    assert top1.token_ids == greedy.token_ids
    assert len(top1.logprobs) == 8
    for token, entry in zip(top1.token_ids, top1.logprobs):
        assert token in entry and max(entry.values()) == entry[token] and len(entry) <= 3


def test_generation_stops_at_the_model_context(tiny_model_factory):
    llm = LLM(tiny_model_factory("llama", max_position_embeddings=64), num_kv_blocks=32)
    out = llm.generate([list(range(3, 60))], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 64 - 57


def test_waiting_bound_counts_only_requests_beyond_the_free_running_slots(tiny_llama):
    from specfleet.engine.engine import EngineOverloaded

    engine = LLM(tiny_llama, num_kv_blocks=32, max_num_seqs=2, max_waiting_requests=1).engine
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    for i in range(3):                                   # two free slots plus one queued
        engine.add_request(f"r{i}", [5, 6, 7], params)
    with pytest.raises(EngineOverloaded):
        engine.add_request("r3", [5, 6, 7], params)
    engine.step()                                        # two run; one still waits, the queue is full
    with pytest.raises(EngineOverloaded):
        engine.add_request("r3", [5, 6, 7], params)
    while engine.has_unfinished():
        engine.step()
    engine.add_request("r4", [5, 6, 7], params)          # drained: admitted again


@pytest.mark.parametrize("low, high", [(0, 4), (3, 2)])
def test_ngram_bounds_out_of_order_are_refused_when_configured(low, high):
    with pytest.raises(ValueError, match="ngram_min <= ngram_max"):
        EngineConfig(model="m", ngram_min=low, ngram_max=high)
