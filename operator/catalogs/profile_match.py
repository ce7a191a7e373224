"""Whether a measured profile prices a service: was it measured on the service's model and accelerator?

The profile catalogue finds a file by its name, `<model>--<accelerator>.json` (`profile_catalog.py`); the
file itself records what `specfleet engine profile` ran (`model`, `device`). A file copied under another
name, or measured on another machine, is refused here (`refusal`), and the planner prices the service on
the roofline and says why. A field the profile leaves empty is not checked (hand-made profiles).

Not checked here: the CPU a CPU profile was measured on (`host`) - a plan is made before any pod exists,
and the catalogue's `cpu` names no CPU; the control loop checks it against the CPU the engines report
(`control/profile_host.py`). The engine commit - it changes with every commit to the repository while the
step costs rarely do, and the online calibration scales a profile toward what the engines are seen to
take (within x5). A profile format that this specfleet cannot read is refused when the file is read
(`profile_format.from_json`).
"""
from __future__ import annotations

import re

from specfleet.operator.api import ModelRef
from specfleet.operator.catalogs.loader import Gpu, ModelCatalog, normalize
from specfleet.operator.catalogs.profile_catalog import model_names
from specfleet.operator.cost import ProfileCost

MEMORY = re.compile(r"\d+gb")


def refusal(cost: ProfileCost, name: str, model: ModelRef, gpu: Gpu, models: ModelCatalog) -> str:
    """Why profile `name` does not price `model` on `gpu` ("" when it does)."""
    if cost.model and not same_model(cost.model, model, models):
        return (f"profile {name} refused: it was measured on model {cost.model!r}, and this service serves "
                f"{model.name!r} ({model.source})")
    device = _device_refusal(cost.device, gpu)
    return f"profile {name} refused: {device}" if device else ""


def same_model(measured: str, model: ModelRef, models: ModelCatalog) -> bool:
    """Whether the profile's `--model` (a built-in name, a hub id, a folder) names the service's model: one
    of its names matches one the profile catalogue knows the service by, or both are one model catalogue
    entry (its aliases)."""
    candidates = measured_names(measured)
    if candidates & set(model_names(model)):
        return True
    served = models.lookup(model)
    return served is not None and any(models.by_name.get(c) is served for c in candidates)


def measured_names(measured: str) -> set[str]:
    """A profile's model as names: the whole, its last part and last two parts (a folder's, a hub id's), and
    the org/name of a hub cache folder (`models--Org--Name/snapshots/<hash>`)."""
    key = normalize(measured.removeprefix("builtin:"))
    parts = [part for part in key.split("/") if part not in ("", ".", "..")]
    names = {key, "/".join(parts[-2:]), *parts[-1:]}
    for part in parts:
        if part.startswith("models--"):
            hub = normalize(part.removeprefix("models--").replace("--", "/"))
            names |= {hub, hub.rsplit("/", 1)[-1]}
    return names - {""}


def _device_refusal(device: str, gpu: Gpu) -> str:
    if not device:
        return ""
    on_cpu = device.lower() == "cpu"
    if gpu.resource is None:
        return "" if on_cpu else f"it was measured on {device!r}, and accelerator {gpu.name} runs the engine on a CPU"
    if on_cpu:
        return f"it was measured on a CPU, and accelerator {gpu.name} is a GPU"
    return "" if same_device(device, gpu.name) else f"it was measured on {device!r}, not on accelerator {gpu.name}"


def same_device(device: str, accelerator: str) -> bool:
    """Whether torch's name for a GPU (`NVIDIA H100 80GB HBM3`) is the catalogue's accelerator
    (`nvidia-h100-80gb`): every word of the accelerator's name but its memory size is one of the device's,
    and a memory size the device's name gives is the accelerator's (an A100-40GB is not an A100-80GB)."""
    have, want = _words(device), _words(accelerator)
    memory = {w for w in want if MEMORY.fullmatch(w)}
    named = {w for w in have if MEMORY.fullmatch(w)}
    return want - memory <= have and (not named or named == memory)


def _words(name: str) -> set[str]:
    return set(re.split(r"[^a-z0-9]+", name.lower())) - {""}
