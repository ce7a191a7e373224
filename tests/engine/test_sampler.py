"""Top-k/top-p truncation over the best candidates equals the full-sort rule, whatever mix a batch holds;
rows that ask for no truncation keep every logit (the full sort's cumulative sum can pass 1.0 in float and
would drop the tail)."""
from __future__ import annotations

import torch

from specfleet.engine import sampler


def _rows(n: int, vocab: int, scale: float, seed: int) -> torch.Tensor:
    return torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * scale


def test_candidate_truncation_equals_the_full_sort_on_a_mixed_batch():
    logits = _rows(6, 49152, scale=4.0, seed=0)                # peaked: every set ends in the candidates
    top_k = torch.tensor([49152, 40, 49152, 1, 300, 49152])     # 300 > CANDIDATES widens the candidate set
    top_p = torch.tensor([0.9, 1.0, 1.0, 1.0, 0.5, 0.3])        # row 2 truncates nothing
    got = sampler._truncate(logits, top_k, top_p)
    truncating = [0, 1, 3, 4, 5]
    assert torch.equal(got[truncating], sampler._truncate_sorted(logits, top_k, top_p)[truncating])
    assert torch.equal(got[2], logits[2]) and int(torch.isfinite(got[3]).sum()) == 1


def test_a_flat_distribution_falls_back_to_the_full_sort():
    logits = _rows(2, 4096, scale=0.01, seed=1)                # top-p 0.9 keeps ~90% of 4096 tokens
    top_k, top_p = torch.tensor([4096, 4096]), torch.tensor([0.9, 0.95])
    got = sampler._truncate(logits, top_k, top_p)
    assert torch.equal(got, sampler._truncate_sorted(logits, top_k, top_p))
    assert int(torch.isfinite(got[0]).sum()) > sampler.CANDIDATES
