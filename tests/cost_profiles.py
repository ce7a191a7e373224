"""Hand-made engine profiles for the operator's tests: a SmolLM2-135M-on-CPU-like cost, in seconds.

The numbers are of the shape `specfleet engine profile` measures on this CPU (a fixed cost per step,
a cost per token, a small attention term), not a measurement: the shipped profile is
`operator/catalogs/profiles/smollm2-135m--cpu.json`.
"""
from __future__ import annotations

from pathlib import Path

from specfleet.engine.profile_model import Acceptance, Profile, StepFit
from specfleet.operator.catalogs.profile_catalog import ProfileCatalog, ProfileEntry
from specfleet.operator.cost import ProfileCost, profile_cost

# As `fit_profile` fits decode and verification together: shared per-sequence, per-token and attention
# costs, a fixed cost per kind.
CPU_FITS = {"decode": StepFit(a=0.030, b=0.0050, c=2.0e-6, rel_rms_error=0.05, num_points=12, s=0.0010),
            "verify": StepFit(a=0.036, b=0.0050, c=2.0e-6, rel_rms_error=0.07, num_points=48, s=0.0010),
            "prefill": StepFit(a=0.030, b=0.0015, c=1.0e-6, rel_rms_error=0.04, num_points=6)}


def cpu_profile(**fits: StepFit) -> Profile:
    return Profile(model="smollm2-135m", device="cpu", dtype="float32", host={"threads": 2}, engine_commit="test",
                   created="2026-01-01T00:00:00Z", points=[], fit={**CPU_FITS, **fits},
                   acceptance=[Acceptance("copy-heavy", 4, 1000, 600), Acceptance("open-ended", 4, 1000, 150)])


def cpu_cost(**fits: StepFit) -> ProfileCost:
    return profile_cost(cpu_profile(**fits), "smollm2-135m--cpu")


def cpu_catalog(**fits: StepFit) -> ProfileCatalog:
    return ProfileCatalog({("smollm2-135m", "cpu"): ProfileEntry("smollm2-135m--cpu", cpu_cost(**fits))})


def write_profile(folder: Path, name: str = "smollm2-135m--cpu") -> Path:
    from specfleet.engine.profile_model import save

    path = folder / f"{name}.json"
    save(cpu_profile(), path)
    return path


def write_text(folder: Path, text: str, name: str = "smollm2-135m--cpu") -> Path:
    path = folder / f"{name}.json"
    path.write_text(text)
    return path
