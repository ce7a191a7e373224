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

    def update(self, state: DetokenizerState, output_ids: list[int], final: bool = False) -> str:
        """The text of `output_ids` so far; `final` also flushes an incomplete trailing character."""
        if state.read_offset >= len(output_ids):
            return state.text
        decode = self.tokenizer.decode
        before = decode(output_ids[state.prefix_offset:state.read_offset], skip_special_tokens=True)
        after = decode(output_ids[state.prefix_offset:], skip_special_tokens=True)
        if len(after) > len(before) and (final or not after.endswith(REPLACEMENT)):
            state.text += after[len(before):]
            state.prefix_offset, state.read_offset = state.read_offset, len(output_ids)
        elif final:
            state.read_offset = len(output_ids)
        return state.text
