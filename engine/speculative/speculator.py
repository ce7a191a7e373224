"""Speculator: proposes drafts before a step, verifies them after it, keeps the statistics.

A sequence in decode state gets up to k draft tokens (`seq.spec_token_ids`); the scheduler then asks
k+1 tokens of budget for it, and the target verifies all of them in the same forward pass as every
other sequence's prefill chunk or decode. While speculation is off, the n-gram proposer still guesses
and its guesses are scored against the tokens actually produced (counterfactual acceptance), so a
controller can tell when switching back on would pay.
"""
from __future__ import annotations

import torch

from specfleet.engine.sampler import SamplingTensors, probabilities
from specfleet.engine.sequence import Sequence
from specfleet.engine.speculative.draft import DraftProposer
from specfleet.engine.speculative.ngram import NgramProposer
from specfleet.engine.speculative.rejection import Verdict, verify, verify_greedy
from specfleet.engine.stats import EngineStats

COUNTERFACTUAL_K = 4


class Speculator:
    def __init__(self, method: str, ngram: NgramProposer, draft: DraftProposer | None, vocab_size: int,
                 max_model_len: int, stats: EngineStats, depths: int = COUNTERFACTUAL_K) -> None:
        self.method = method
        self.ngram = ngram
        self.draft = draft
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.stats = stats
        self.depths = max(depths, COUNTERFACTUAL_K)           # proposal lengths are counted up to this k
        self._drafted: dict[str, tuple[int, int]] = {}         # request_id -> (tokens before, k drafted)
        self._guess: dict[str, tuple[list[int], int]] = {}     # counterfactual: (guess, tokens matched)

    # ---- before the step ------------------------------------------------------------------
    def propose(self, running: list[Sequence], k: int) -> list[Sequence]:
        seqs = [s for s in running if s.num_uncomputed_tokens == 1 and s.num_output_tokens > 0 and self._room(s, k)]
        if not seqs:
            return []
        if self.draft is not None:
            drafts = self.draft.propose(seqs, k)
            for seq, (tokens, probs) in zip(seqs, drafts):
                self._drafted[seq.request_id] = (seq.num_tokens, len(tokens))
                seq.spec_token_ids = tokens[:self._room(seq, k)]
                seq.spec_draft_probs = probs
        else:
            for seq in seqs:
                proposal = self._fresh(seq)
                seq.spec_token_ids = proposal[:self._room(seq, k)]
                seq.spec_draft_probs = None
        return [s for s in seqs if s.spec_token_ids]

    def _fresh(self, seq: Sequence) -> list[int]:
        """A fresh n-gram proposal as deep as any k the switch allows. With n-gram drafting its length is
        counted at every depth: the draft share there (a draft model always drafts k)."""
        proposal = self.ngram.propose(seq.token_ids, self.depths)
        if self.draft is None:
            self._count_proposal(len(proposal))
        return proposal

    def _count_proposal(self, length: int) -> None:
        s = self.stats
        if len(s.ngram_proposed_by_depth) < self.depths:
            s.ngram_proposed_by_depth += [0] * (self.depths - len(s.ngram_proposed_by_depth))
        s.ngram_proposal_seq_steps += 1
        for depth in range(1, self.depths + 1):
            s.ngram_proposed_by_depth[depth - 1] += min(length, depth)

    def _room(self, seq: Sequence, k: int) -> int:
        return max(0, min(k, seq.params.max_tokens - seq.num_output_tokens - 1,
                          self.max_model_len - seq.num_tokens - 1))

    def drop(self, seq: Sequence) -> None:
        """The scheduler could not fit (or preempted) a drafted sequence: forget its drafts."""
        seq.spec_token_ids, seq.spec_draft_probs = [], None
        self._rollback(seq, 0)

    # ---- after the step -------------------------------------------------------------------
    def verify(self, seqs: list[Sequence], logits: torch.Tensor) -> Verdict:
        """logits: the k_i+1 rows of each sequence, in order."""
        if all(s.params.temperature == 0 and s.spec_draft_probs is None for s in seqs):
            verdict = verify_greedy(logits, [s.spec_token_ids for s in seqs])
        else:
            verdict = self._verify_sampled(seqs, logits)
        for seq, accepted in zip(seqs, verdict.num_accepted):
            self._count(len(seq.spec_token_ids), accepted)
            self._rollback(seq, accepted)
            seq.spec_token_ids, seq.spec_draft_probs = [], None
        return verdict

    def _verify_sampled(self, seqs: list[Sequence], logits: torch.Tensor) -> Verdict:
        k = max(len(s.spec_token_ids) for s in seqs)
        lens = [len(s.spec_token_ids) for s in seqs]
        row_params = [s.params for s in seqs for _ in range(len(s.spec_token_ids) + 1)]
        flat = probabilities(logits, SamplingTensors.build(row_params, self.vocab_size, logits.device))
        target = flat.new_zeros(len(seqs), k + 1, flat.shape[-1])
        draft = flat.new_zeros(len(seqs), k, flat.shape[-1])
        drafts = torch.full((len(seqs), k), -1, dtype=torch.long, device=logits.device)
        offset = 0
        for i, seq in enumerate(seqs):
            n = lens[i]
            target[i, :n + 1] = flat[offset:offset + n + 1]
            offset += n + 1
            drafts[i, :n] = torch.tensor(seq.spec_token_ids, device=logits.device)
            if seq.spec_draft_probs is not None:
                draft[i, :n] = seq.spec_draft_probs[:n]
            else:
                draft[i, :n].scatter_(-1, drafts[i, :n, None], 1.0)
        return verify(target, draft, drafts, torch.tensor(lens, device=logits.device), [s.generator for s in seqs])

    def _count(self, drafted: int, accepted: int) -> None:
        s = self.stats
        s.spec_drafts += 1
        s.spec_draft_tokens += drafted
        s.spec_accepted_tokens += accepted
        if len(s.spec_accepted_by_position) < drafted:
            s.spec_accepted_by_position += [0] * (drafted - len(s.spec_accepted_by_position))
        for pos in range(accepted):
            s.spec_accepted_by_position[pos] += 1

    def _rollback(self, seq: Sequence, accepted: int) -> None:
        before = self._drafted.pop(seq.request_id, None)
        if self.draft is not None and before is not None:
            self.draft.rollback(seq, accepted, before[1], before[0])

    def release(self, request_id: str) -> None:
        self._drafted.pop(request_id, None)
        self._guess.pop(request_id, None)
        if self.draft is not None:
            self.draft.release(request_id)

    # ---- counterfactual acceptance while off -----------------------------------------------
    def observe(self, seq: Sequence, new_tokens: list[int], k: int = 0) -> None:
        """Score the standing n-gram guess against tokens produced without speculation, and count the
        fresh proposal the next step would draft: the draft share per token here, which the controller
        converts to the share per step it would see speculating. A guess is as deep as `k`, the depth the
        switch holds while off (COUNTERFACTUAL_K where it holds none): the operator converts the rate at the
        depth the engine reports (`specfleet:num_speculative_tokens`), and n-gram acceptance falls with the
        position, so a rate scored over four tokens read as the rate of one understates the acceptance at k = 1."""
        guess, matched = self._guess.pop(seq.request_id, ([], 0))
        self.stats.counterfactual_seq_steps += 1
        for token in new_tokens:
            if matched < len(guess) and guess[matched] == token:
                matched += 1
                continue
            self._settle(guess, matched)
            guess, matched = [], 0
            break
        if guess and matched == len(guess):
            self._settle(guess, matched)
            guess, matched = [], 0
        fresh = self._fresh(seq) if seq.finish_reason is None and self._room(seq, 1) else []
        if not guess:
            guess = fresh[:k or COUNTERFACTUAL_K]
        if guess:
            self._guess[seq.request_id] = (guess, matched)

    def _settle(self, guess: list[int], matched: int) -> None:
        if guess:
            self.stats.counterfactual_draft_tokens += len(guess)
            self.stats.counterfactual_accepted_tokens += matched
