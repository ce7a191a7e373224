"""N-gram (prompt lookup) proposer: continue the sequence the way it continued last time.

The longest suffix of `max_n` down to `min_n` tokens that also occurs earlier in the sequence (within a
bounded window) proposes the tokens that followed its most recent earlier occurrence. Pure Python over
token ids; no model, no device work.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NgramProposer:
    min_n: int = 1
    max_n: int = 4
    window: int = 1024

    def propose(self, token_ids: list[int], k: int) -> list[int]:
        if k <= 0:
            return []
        tokens = token_ids[-self.window:]
        for n in range(min(self.max_n, len(tokens) - 1), self.min_n - 1, -1):
            suffix = tokens[-n:]
            start = self._last_earlier_match(tokens, suffix)
            if start is not None:
                follow = start + n
                return tokens[follow:follow + k]
        return []

    @staticmethod
    def _last_earlier_match(tokens: list[int], suffix: list[int]) -> int | None:
        n, first = len(suffix), suffix[0]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start] == first and tokens[start:start + n] == suffix:
                return start
        return None
