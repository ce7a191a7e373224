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

from testkit import build_step  # noqa: E402


@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device("cuda" if ON_CUDA else "cpu")


@pytest.fixture(name="build_step")
def _build_step_fixture():
    return build_step
