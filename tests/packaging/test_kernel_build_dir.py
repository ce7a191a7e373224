"""The CPU kernel's build folder is keyed by the torch installation: two virtual environments with their
own torch do not rebuild it for each other, one sharing another's torch shares its build."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from specfleet.engine.cpu import attention  # noqa: E402  (needs torch)


def test_each_torch_installation_gets_its_own_kernel_build_folder(monkeypatch):
    here = attention.kernel_build_dir()
    assert attention.kernel_build_dir() == here
    monkeypatch.setattr(torch, "__file__", "/elsewhere/venv/lib/python3.11/site-packages/torch/__init__.py")
    there = attention.kernel_build_dir()
    assert there != here and there.parent == here.parent
