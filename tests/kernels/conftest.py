"""Kernel tests run the triton kernels on CPU through the interpreter.

TRITON_INTERPRET must be set before `triton.jit` decorates the kernels, i.e. before
`specfleet.engine.kernels` is first imported, so it is set here at import time and the package is
imported at once. It stays set for the process (triton reads it again while interpreting); nothing
else in the test-suite uses triton on CPU, and `tests/kernels/test_isolation.py` checks that a
process importing this conftest still runs the torch path and CUDA-free engine unchanged.
On a CUDA machine, `SPECFLEET_KERNEL_TESTS_ON_CUDA=1` runs the same tests compiled on the GPU.
"""
from __future__ import annotations

import os

import pytest
import torch

ON_CUDA = os.environ.get("SPECFLEET_KERNEL_TESTS_ON_CUDA") == "1" and torch.cuda.is_available()
if not ON_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"
import specfleet.engine.kernels  # noqa: E402,F401  (decorates the kernels under the flag above)

from specfleet.engine.attention import AttentionGroup, AttentionMetadata  # noqa: E402


@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device("cuda" if ON_CUDA else "cpu")


def build_step(query_lens: list[int], context_lens: list[int], block_size: int, num_blocks: int,
               device: torch.device, seed: int = 0) -> AttentionMetadata:
    """Metadata as the model runner lays it out: sequences ordered by query length, random block tables."""
    order = sorted(range(len(query_lens)), key=lambda i: query_lens[i])
    qlens = [query_lens[i] for i in order]
    ctx = [context_lens[i] for i in order]
    gen = torch.Generator().manual_seed(seed)
    free = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()     # block 0 doubles as padding
    tables = []
    for c in ctx:
        n = -(-c // block_size)
        tables.append(free[:n])
        free = free[n:]
    width = max(len(t) for t in tables)
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=device)
    ctx_t = torch.tensor(ctx, dtype=torch.int32, device=device)
    groups, start, i = [], 0, 0
    while i < len(qlens):
        j = i
        while j < len(qlens) and qlens[j] == qlens[i]:
            j += 1
        groups.append(AttentionGroup(start, j - i, qlens[i], ctx_t[i:j], table[i:j]))
        start, i = start + (j - i) * qlens[i], j
    starts = torch.tensor([0] + qlens, device=device).cumsum(0).to(torch.int32)
    slots = [t[p // block_size] * block_size + p % block_size
             for t, q, c in zip(tables, qlens, ctx) for p in range(c - q, c)]
    return AttentionMetadata(torch.tensor(slots, dtype=torch.long, device=device), groups, starts, ctx_t,
                             table, max(qlens))


@pytest.fixture(name="build_step")
def _build_step_fixture():
    return build_step
