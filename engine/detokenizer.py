"""Incremental detokenization: each step decodes a few tokens per sequence, not its whole output.

Decoding a window that starts a few tokens back (`prefix_offset`) and diffing it against the text of
that window without the new tokens keeps word boundaries and multi-byte characters right; text is only
emitted once it no longer ends in an incomplete UTF-8 sequence (U+FFFD), and `finish` flushes the rest.
"""
from __future__ import annotations

from dataclasses import dataclass

REPLACEMENT = "\ufffd"


@dataclass
class DetokenizerState:
    text: str = ""
    prefix_offset: int = 0      # first output token of the context window
    read_offset: int = 0        # output tokens already turned into text


class IncrementalDetokenizer:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def update(self, state: DetokenizerState, token_ids: list[int], start: int = 0, final: bool = False) -> str:
        """The text of `token_ids[start:]` (the output, after the prompt) so far; `final` also flushes an
        incomplete trailing character. Offsets count from `start`, so the output is never copied whole."""
        end = len(token_ids) - start
        if state.read_offset >= end:
            return state.text
        decode = self.tokenizer.decode
        window = start + state.prefix_offset
        before = decode(token_ids[window:start + state.read_offset], skip_special_tokens=True)
        after = decode(token_ids[window:], skip_special_tokens=True)
        if len(after) > len(before) and (final or not after.endswith(REPLACEMENT)):
            state.text += after[len(before):]
            state.prefix_offset, state.read_offset = state.read_offset, end
        elif final:
            state.read_offset = end
        return state.text
