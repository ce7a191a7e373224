"""The kernels lower to Hopper PTX and machine code (triton's bundled ptxas), no GPU needed.

The interpreter runs the kernels' Python, not their compilation: this catches the constructs that
only fail in the compiler. It runs in a subprocess because this process built the kernels interpreted.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "compile_check.py"


def test_kernels_compile_for_sm90():
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    result = subprocess.run([sys.executable, str(SCRIPT), "--quick"], env=env, capture_output=True,
                            text=True, timeout=300)
    if result.returncode != 0 and "ptxas" in result.stderr and "not found" in result.stderr:
        pytest.skip("no ptxas in this triton build")
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "FAILED" not in result.stdout
