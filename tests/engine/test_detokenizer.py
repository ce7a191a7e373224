"""Incremental detokenization gives the same text as decoding the whole output at once."""
from __future__ import annotations

import random

import pytest
from transformers import AutoTokenizer

from specfleet.engine.detokenizer import DetokenizerState, IncrementalDetokenizer

TEXTS = ["Hello, world! Kubernetes schedules pods.", "naïve café — 東京 and 🚀🚀 rockets", "  two  spaces\nnew line\t"]


def stream(detok: IncrementalDetokenizer, ids: list[int], chunk_sizes: list[int],
           prompt: list[int] = ()) -> tuple[str, list[str]]:
    """Feed `ids` after `prompt` (which is never decoded) in chunks; the text after each chunk."""
    state, seen, pos = DetokenizerState(), [], 0
    for size in chunk_sizes:
        pos = min(len(ids), pos + size)
        seen.append(detok.update(state, [*prompt, *ids[:pos]], len(prompt), final=pos == len(ids)))
        if pos == len(ids):
            break
    return seen[-1], seen


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_text_equals_full_decode(tiny_llama, text):
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    ids = tokenizer.encode(text)
    rng = random.Random(0)
    for _ in range(5):
        prompt = tokenizer.encode("prompt text ")
        final, seen = stream(IncrementalDetokenizer(tokenizer), ids, [rng.randint(1, 3) for _ in range(len(ids))],
                             prompt)
        assert final == tokenizer.decode(ids, skip_special_tokens=True)
        assert all(b.startswith(a) for a, b in zip(seen, seen[1:]))          # text only ever grows
        assert all(not s.endswith("\ufffd") for s in seen[:-1])              # no half characters emitted


def test_random_token_ids_match_full_decode(tiny_llama):
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    rng = random.Random(1)
    for _ in range(20):
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randint(1, 40))]
        final, _ = stream(IncrementalDetokenizer(tokenizer), ids, [1] * len(ids))
        assert final == tokenizer.decode(ids, skip_special_tokens=True)
