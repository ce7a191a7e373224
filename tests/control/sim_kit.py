"""A small SmolLM2-on-CPU-like engine profile and the CPU example's spec, for the simulator's tests
(tests/control/test_simulator_truth.py, test_contention.py)."""
from __future__ import annotations

from pathlib import Path

import yaml

from specfleet.engine import profile_model as P

ROOT = Path(__file__).resolve().parents[2]
CPU_SPEC = yaml.safe_load((ROOT / "manifests/examples/smollm2-cpu.yaml").read_text())["spec"]


def profile(decode_a: float = 0.08, per_token: float = 0.004, verify_a: float = 0.16,
            copy_rate: float = 0.55, open_rate: float = 0.3) -> P.Profile:
    """A SmolLM2-on-CPU-like profile: decode T = a + b x tokens, verify dearer per step."""
    fit = {"decode": P.StepFit(decode_a, per_token, 0.0, 0.0, 4),
           "verify": P.StepFit(verify_a, per_token, 0.0, 0.0, 4),
           "prefill": P.StepFit(0.05, 0.0025, 0.0, 0.0, 4)}
    acceptance = [P.Acceptance("copy-heavy", 4, 1000, round(1000 * copy_rate)),
                  P.Acceptance("open-ended", 4, 1000, round(1000 * open_rate))]
    return P.Profile("smollm2-135m", "cpu", "float32", {}, "", "test", [], fit, acceptance)
