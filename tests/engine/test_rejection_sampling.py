"""The verifier's output must follow the target distribution exactly, whatever the draft."""
from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from specfleet.engine.speculative.ngram import NgramProposer
from specfleet.engine.speculative.rejection import verify

TRIALS = 40_000


def random_dist(gen: torch.Generator, *shape: int) -> torch.Tensor:
    logits = torch.randn(*shape, generator=gen) * 1.5
    return logits.softmax(-1)


@pytest.mark.parametrize("draft_kind", ["model", "one-hot"])
def test_first_token_follows_the_target_distribution(draft_kind):
    gen = torch.Generator().manual_seed(0)
    vocab, k = 6, 3
    p = random_dist(gen, 1, k + 1, vocab).expand(TRIALS, -1, -1)
    if draft_kind == "model":
        q = random_dist(gen, 1, k, vocab).expand(TRIALS, -1, -1)
        drafts = torch.multinomial(q[0, 0], TRIALS, replacement=True, generator=gen)[:, None].repeat(1, k)
        drafts[:, 1:] = torch.multinomial(q[0, 1], TRIALS * (k - 1), replacement=True, generator=gen).view(TRIALS, -1)
    else:                                                            # n-gram: a fixed guess, q one-hot
        drafts = torch.tensor([[2, 4, 1]]).repeat(TRIALS, 1)
        q = torch.zeros(TRIALS, k, vocab).scatter_(-1, drafts[..., None], 1.0)
    torch.manual_seed(1)
    verdict = verify(p, q, drafts, torch.full((TRIALS,), k), [None] * TRIALS)
    first = torch.tensor([tokens[0] for tokens in verdict.tokens])
    observed = torch.bincount(first, minlength=vocab).double()
    expected = p[0, 0].double() / p[0, 0].double().sum() * observed.sum()
    assert chisquare(observed, expected).pvalue > 1e-3


def test_greedy_accepts_exactly_the_argmax_prefix():
    vocab = 5
    p = torch.zeros(1, 4, vocab)
    p[0, torch.arange(4), torch.tensor([3, 1, 4, 0])] = 1.0                 # greedy target: 3, 1, 4, 0
    drafts = torch.tensor([[3, 1, 2]])
    q = torch.zeros(1, 3, vocab).scatter_(-1, drafts[..., None], 1.0)
    verdict = verify(p, q, drafts, torch.tensor([3]), [None])
    assert verdict.num_accepted == [2] and verdict.tokens == [[3, 1, 4]]


def test_all_accepted_adds_the_bonus_token_and_short_drafts_stop_early():
    vocab = 4
    p = torch.zeros(2, 3, vocab)
    p[:, torch.arange(3), torch.tensor([1, 2, 3])] = 1.0
    drafts = torch.tensor([[1, 2], [1, -1]])
    q = torch.zeros(2, 2, vocab)
    q[0].scatter_(-1, drafts[0, :, None], 1.0)
    q[1, 0, 1] = 1.0
    verdict = verify(p, q, drafts, torch.tensor([2, 1]), [None, None])
    assert verdict.tokens == [[1, 2, 3], [1, 2]]


def test_ngram_proposes_the_continuation_of_the_latest_earlier_match():
    proposer = NgramProposer(min_n=1, max_n=3)
    assert proposer.propose([1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3], 3) == [7, 8, 5]
    assert proposer.propose([4, 5, 6], 2) == []


def test_the_greedy_fast_path_returns_what_full_verification_returns_for_one_hot_targets_and_drafts():
    from specfleet.engine.speculative.rejection import verify_greedy

    gen = torch.Generator().manual_seed(7)
    vocab, lens = 50, [4, 0, 2, 3, 1, 4]
    logits = torch.randn(sum(lens) + len(lens), vocab, generator=gen)
    best = logits.argmax(-1).tolist()
    drafts, offset = [], 0
    for i, n in enumerate(lens):            # drafts that follow the argmax for a while, then (some) diverge
        row = best[offset:offset + n + 1]
        drafts.append([t if j < i % (n + 1) else (t + 1) % vocab for j, t in enumerate(row[:n])])
        offset += n + 1
    k = max(lens)
    target, draft = torch.zeros(len(lens), k + 1, vocab), torch.zeros(len(lens), k, vocab)
    padded = torch.full((len(lens), k), -1, dtype=torch.long)
    offset = 0
    for i, n in enumerate(lens):
        target[i, :n + 1] = torch.nn.functional.one_hot(torch.tensor(best[offset:offset + n + 1]), vocab).float()
        offset += n + 1
        padded[i, :n] = torch.tensor(drafts[i], dtype=torch.long)
        draft[i, :n].scatter_(-1, padded[i, :n, None], 1.0)
    full = verify(target, draft, padded, torch.tensor(lens), [None] * len(lens))
    fast = verify_greedy(logits, drafts)
    assert fast.num_accepted == full.num_accepted and fast.tokens == full.tokens
    assert 0 < sum(fast.num_accepted) < sum(lens)          # both accepts and rejections were exercised
