"""Speculation inside continuous batching: lossless, switchable live, observable."""
from __future__ import annotations

import random

import pytest
import torch
from scipy.stats import chi2_contingency

from specfleet.engine import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module")
def models(tiny_model_factory):
    target = tiny_model_factory("llama")
    other = tiny_model_factory("llama", seed=7, num_layers=1)        # a draft that often disagrees
    return target, other


@pytest.fixture(scope="module")
def reference(models, mixed_prompts):
    prompts = mixed_prompts(32, seed=11)
    outs = LLM(models[0], num_kv_blocks=256).generate(prompts, GREEDY)
    return prompts, [o.token_ids for o in outs]


def spec_llm(models, method: str, **kw) -> LLM:
    target, other = models
    extra = {"draft_model": other} if method == "draft" else {"ngram_min": 1}   # random models rarely repeat 2-grams
    return LLM(target, num_kv_blocks=256, speculative_method=method, num_speculative_tokens=4, **extra, **kw)


@pytest.mark.parametrize("method", ["ngram", "draft"])
@pytest.mark.parametrize("batch", [1, 32])
def test_greedy_outputs_identical_with_speculation(models, reference, method, batch):
    prompts, expected = reference
    llm = spec_llm(models, method)
    outs = llm.generate(prompts[:batch], GREEDY)
    assert [o.token_ids for o in outs] == expected[:batch]
    assert llm.engine.stats.spec_drafts > 0
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks


def test_draft_equal_to_target_accepts_everything(models, reference):
    prompts, expected = reference
    llm = LLM(models[0], num_kv_blocks=256, speculative_method="draft", draft_model=models[0], num_speculative_tokens=3)
    outs = llm.generate(prompts[:8], GREEDY)
    stats = llm.engine.stats
    assert [o.token_ids for o in outs] == expected[:8]
    assert stats.spec_accepted_tokens == stats.spec_draft_tokens > 0


def test_sampled_tokens_follow_the_target_distribution(models):
    """Two-sample chi-square: token 2 (verified by speculation) vs plain sampling, over many seeds."""
    n = 600
    params = [SamplingParams(temperature=1.0, top_k=4, max_tokens=3, seed=s, ignore_eos=True) for s in range(n)]
    prompt = [5, 6, 7, 8, 9]
    plain = LLM(models[0], num_kv_blocks=256).generate([prompt] * n, params)
    params2 = [SamplingParams(temperature=1.0, top_k=4, max_tokens=3, seed=s + 10_000, ignore_eos=True) for s in range(n)]
    llm = spec_llm(models, "draft")
    spec = llm.generate([prompt] * n, params2)
    assert llm.engine.stats.spec_drafts > 0
    a = [tuple(o.token_ids[1:3]) for o in plain]
    b = [tuple(o.token_ids[1:3]) for o in spec]
    cats = sorted(set(a) | set(b))
    table = [[a.count(c) for c in cats], [b.count(c) for c in cats]]
    keep = [i for i in range(len(cats)) if table[0][i] + table[1][i] >= 10]
    rest = [sum(row[i] for i in range(len(cats)) if i not in keep) for row in table]
    table = [[row[i] for i in keep] + [r] for row, r in zip(table, rest)]
    assert chi2_contingency(table).pvalue > 1e-3


def test_toggling_speculation_while_32_streams_run_changes_no_output(models, reference):
    prompts, expected = reference
    llm = spec_llm(models, "ngram")
    engine = llm.engine
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, GREEDY)
    rng, done, step = random.Random(0), {}, 0
    while engine.has_unfinished():
        if step % 3 == 0:
            engine.set_speculation(enabled=rng.random() < 0.6, num_speculative_tokens=rng.randint(0, 4))
        done.update({o.request_id: o.token_ids for o in engine.step() if o.finished})
        step += 1
    assert [done[f"r{i}"] for i in range(len(prompts))] == expected


def test_disabled_or_zero_depth_takes_the_plain_path_and_counts_counterfactuals(models, reference):
    prompts, expected = reference
    llm = spec_llm(models, "ngram")
    llm.set_speculation(enabled=False)
    outs = llm.generate(prompts[:8], SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True))
    stats = llm.engine.stats
    assert stats.spec_drafts == 0
    assert stats.counterfactual_draft_tokens > 0
    llm.set_speculation(enabled=True, num_speculative_tokens=0)
    llm.generate(prompts[:2], GREEDY)
    assert stats.spec_drafts == 0
    with pytest.raises(ValueError, match="between 0 and 4"):
        llm.set_speculation(num_speculative_tokens=9)


@pytest.mark.parametrize("k", [1, 4])
def test_counterfactual_guesses_are_as_deep_as_the_switch_holds_k_while_off(models, k):
    """The operator converts the counterfactual rate at the k the engine reports: a guess scored while off is
    that many tokens long, no more (n-gram acceptance falls with the position)."""
    llm = spec_llm(models, "ngram")
    llm.set_speculation(enabled=False, num_speculative_tokens=k)
    settled = []
    speculator = llm.engine.speculator
    settle = speculator._settle
    speculator._settle = lambda guess, matched: (settled.append(len(guess)), settle(guess, matched))
    prompts = [[5, 6, 7, 8] * 12 for _ in range(4)]                 # repeats: the n-gram drafter finds matches
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True))
    assert settled and max(settled) == k, settled
    assert sum(settled) == llm.engine.stats.counterfactual_draft_tokens


def test_steps_count_verifying_sequences_as_decoding_and_the_draft_share_is_exported(models, mixed_prompts):
    llm = spec_llm(models, "ngram")
    records = []
    llm.engine.step_listeners.append(records.append)
    prompts = [[5, 6, 7, 8] * 12 for _ in range(4)]                 # repeats: the n-gram drafter finds matches
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    stats = llm.engine.stats
    verifying = [r for r in records if r.speculating]
    assert verifying, "no step verified drafts"
    # A step that only decodes or verifies has no prompt tokens, however many drafts it verified.
    full = [r for r in verifying if r.num_tokens > r.num_seqs and r.num_seqs == 4]
    assert full and all(r.num_decode_seqs == 4 and r.num_prefill_tokens == 0 for r in full)
    assert 0 < stats.spec_drafts <= stats.spec_decode_seq_steps
    assert stats.spec_decode_seq_steps == sum(r.num_decode_seqs for r in records)
    on_steps, on_by_depth = stats.ngram_proposal_seq_steps, list(stats.ngram_proposed_by_depth)
    assert 0 < stats.spec_draft_tokens <= on_by_depth[llm.engine.speculation.active_k - 1]
    llm.set_speculation(enabled=False)
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    assert 0 < stats.ngram_proposal_seq_steps - on_steps <= stats.counterfactual_seq_steps
    for by_depth, steps in ((on_by_depth, on_steps), (stats.ngram_proposed_by_depth, stats.ngram_proposal_seq_steps)):
        assert len(by_depth) == 4 and 0 < by_depth[0] <= steps
        gains = [b - a for a, b in zip([0, *by_depth], by_depth)]     # proposals at least j long, per depth j
        assert all(later <= earlier for earlier, later in zip(gains, gains[1:]))
