"""Token sampling: greedy, temperature, top-k, top-p, per-request seeds, and logprobs.

`probabilities` turns logits into the distribution a request samples from (the speculative verifier
uses the same function for target and draft); top-k/top-p look at each row's best few hundred logits
rather than sorting the whole vocabulary, and all-greedy batches only take an argmax. `sample` draws
from it with the exponential-race trick (argmax p / E, E ~ Exp(1)), which lets seeded requests draw
their noise from their own generator.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specfleet.engine.sampling_params import SamplingParams


@dataclass
class SamplingTensors:
    temperature: torch.Tensor   # [n]; 0 marks greedy rows
    top_k: torch.Tensor         # [n]; vocab size when off
    top_p: torch.Tensor         # [n]
    all_greedy: bool
    any_truncation: bool

    @classmethod
    def build(cls, params: list[SamplingParams], vocab_size: int, device: torch.device) -> "SamplingTensors":
        temps = [0.0 if p.greedy else p.temperature for p in params]
        top_k = [p.top_k if p.top_k > 0 else vocab_size for p in params]
        top_p = [p.top_p for p in params]
        return cls(torch.tensor(temps, device=device), torch.tensor(top_k, device=device),
                   torch.tensor(top_p, device=device), all(t == 0.0 for t in temps),
                   any(k < vocab_size for k in top_k) or any(p < 1.0 for p in top_p))


def probabilities(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    """[n, vocab] sampling distribution; greedy rows become one-hot on their argmax."""
    temps = torch.where(t.temperature > 0, t.temperature, torch.ones_like(t.temperature))
    scaled = logits / temps[:, None]
    if t.any_truncation:
        scaled = _truncate(scaled, t.top_k, t.top_p)
    probs = scaled.softmax(dim=-1)
    greedy = t.temperature == 0
    if greedy.any():
        one_hot = torch.zeros_like(probs).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        probs = torch.where(greedy[:, None], one_hot, probs)
    return probs


CANDIDATES = 256     # top-k/top-p first look at this many best logits per row; a full sort only if they fall short


def _truncate(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Logits outside each row's top-k and top-p set become -inf. The set almost always lies in the few
    hundred best tokens, so `topk` over those replaces sorting the whole vocabulary (49k for SmolLM2);
    rows whose set might reach past them (a flat distribution, a large top_k) take the full sort."""
    vocab = logits.shape[-1]
    untouched = (top_k >= vocab) & (top_p >= 1.0)              # rows of a mixed batch that truncate nothing
    width = min(vocab, max(CANDIDATES, int(top_k[top_k < vocab].max()) if bool((top_k < vocab).any()) else 0))
    truncated = None
    if width < vocab:
        values, order = logits.topk(width, dim=-1)
        kept, covered = _truncate_candidates(values, top_k, top_p, logits.logsumexp(dim=-1, keepdim=True))
        if bool((covered | untouched).all()):
            truncated = torch.full_like(logits, float("-inf")).scatter_(-1, order, kept)
    if truncated is None:
        truncated = _truncate_sorted(logits, top_k, top_p)
    return torch.where(untouched[:, None], logits, truncated)


def _truncate_candidates(ordered: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, log_total: torch.Tensor):
    """The full-sort rule applied to each row's best `width` logits (descending): (kept logits, and per row
    whether the kept set is known to end inside them)."""
    width = ordered.shape[-1]
    ranks = torch.arange(width, device=ordered.device)
    drop = ranks[None, :] >= top_k[:, None]
    ordered = ordered.masked_fill(drop, float("-inf"))
    k_inside = top_k <= width
    # With top-k on, top-p renormalizes over the k kept tokens (all here); without it, over the whole vocab.
    probs = torch.where(k_inside[:, None], ordered.softmax(dim=-1), (ordered - log_total).exp())
    before = probs.cumsum(dim=-1) - probs
    drop |= before > top_p[:, None]
    return ordered.masked_fill(drop, float("-inf")), k_inside | (before[:, -1] > top_p)


def _truncate_sorted(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    ordered, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1], device=logits.device)
    drop = ranks[None, :] >= top_k[:, None]
    ordered = ordered.masked_fill(drop, float("-inf"))
    sorted_probs = ordered.softmax(dim=-1)
    drop |= (sorted_probs.cumsum(dim=-1) - sorted_probs) > top_p[:, None]
    ordered = ordered.masked_fill(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter_(-1, order, ordered)


def exponential_noise(shape: torch.Size, generators: list[torch.Generator | None], device) -> torch.Tensor:
    noise = torch.empty(shape, device=device).exponential_()
    for row, gen in enumerate(generators):
        if gen is not None:
            noise[row].exponential_(generator=gen)
    return noise


def sample(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    noise = exponential_noise(probs.shape, generators, probs.device)
    return (probs / noise).argmax(dim=-1)


def sample_tokens(logits: torch.Tensor, t: SamplingTensors,
                  generators: list[torch.Generator | None]) -> torch.Tensor:
    if t.all_greedy:
        return logits.argmax(dim=-1)
    return sample(probabilities(logits, t), generators)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, num_top: list[int | None]) -> list[dict[int, float] | None]:
    """Log-probabilities of the sampled tokens (and each row's top-n) under the raw model distribution."""
    logprobs = logits.log_softmax(dim=-1)
    width = max((n or 0) for n in num_top)
    top_vals, top_ids = logprobs.topk(width, dim=-1) if width else (None, None)
    chosen = logprobs.gather(-1, tokens[:, None]).squeeze(-1)
    out: list[dict[int, float] | None] = []
    for row, n in enumerate(num_top):
        if n is None:
            out.append(None)
            continue
        entry = {int(tokens[row]): float(chosen[row])}
        if n:
            entry.update(zip(top_ids[row, :n].tolist(), top_vals[row, :n].tolist()))
        out.append(entry)
    return out
