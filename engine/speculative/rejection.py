"""Lossless speculative verification (Leviathan et al. 2023; Chen et al. 2023).

Draft token d at position i is accepted with probability min(1, p_i(d) / q_i(d)); at the first
rejection the token is drawn from normalize(max(0, p_i - q_i)); if all drafts pass, a bonus token comes
from p_k. The output then follows p exactly. n-gram drafts are deterministic (q one-hot); greedy
requests have one-hot p, so verification reduces to "accept while the draft equals the argmax".
Positions past a sequence's own draft length carry q = 0, which turns the residual into p: the bonus.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specfleet.engine.sampler import sample


@dataclass
class Verdict:
    num_accepted: list[int]        # per sequence, accepted draft tokens
    tokens: list[list[int]]        # per sequence, accepted drafts followed by one sampled token


def verify(target_probs: torch.Tensor, draft_probs: torch.Tensor, drafts: torch.Tensor, draft_lens: torch.Tensor,
           generators: list[torch.Generator | None]) -> Verdict:
    """target_probs [n, k+1, V]; draft_probs [n, k, V] (zero rows past each draft); drafts [n, k] (pad -1)."""
    n, k = drafts.shape
    safe = drafts.clamp(min=0)
    p = target_probs[:, :k].gather(-1, safe[..., None]).squeeze(-1)               # [n, k]
    q = draft_probs.gather(-1, safe[..., None]).squeeze(-1)
    u = _uniform((n, k), generators, drafts.device)
    valid = torch.arange(k, device=drafts.device)[None, :] < draft_lens[:, None]
    ok = valid & (u * q < p)                                                        # u < p/q without dividing
    num_accepted = (ok.cumprod(dim=1)).sum(dim=1)                                   # leading run of accepts
    rows = torch.arange(n, device=drafts.device)
    p_at = target_probs[rows, num_accepted]                                         # [n, V]
    q_at = torch.cat([draft_probs, torch.zeros_like(draft_probs[:, :1])], dim=1)[rows, num_accepted]
    residual = (p_at - q_at).clamp(min=0)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_at)     # p == q: fall back to p
    last = sample(residual / residual.sum(-1, keepdim=True), generators)
    accepted = num_accepted.tolist()
    drafts_list = drafts.tolist()
    tokens = [drafts_list[i][:a] + [int(last[i])] for i, a in enumerate(accepted)]
    return Verdict(accepted, tokens)


def verify_greedy(logits: torch.Tensor, drafts: list[list[int]]) -> Verdict:
    """Greedy targets, deterministic drafts: what `verify` returns for one-hot p and q (accept while the
    draft equals the argmax, then the argmax), from the logits' argmax alone instead of [n, k+1, V]
    distributions. logits: the len(draft)+1 rows of each sequence, in order."""
    best = logits.argmax(-1).tolist()
    num_accepted, tokens, offset = [], [], 0
    for draft in drafts:
        row = best[offset:offset + len(draft) + 1]
        accepted = 0
        while accepted < len(draft) and draft[accepted] == row[accepted]:
            accepted += 1
        num_accepted.append(accepted)
        tokens.append(draft[:accepted] + [row[accepted]])
        offset += len(draft) + 1
    return Verdict(num_accepted, tokens)


def _uniform(shape: tuple[int, int], generators: list[torch.Generator | None], device) -> torch.Tensor:
    u = torch.rand(shape, device=device)
    for row, gen in enumerate(generators):
        if gen is not None:
            u[row] = torch.rand(shape[1], generator=gen, device=device)
    return u
