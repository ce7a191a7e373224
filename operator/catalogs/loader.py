"""The GPU and model catalogs: data files (`gpus.yaml`, `models.yaml`) loaded into typed objects.

`gpus()` and `models()` load the packaged files once; pass a path to load another file (tests, a
ConfigMap mounted into the operator).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Mapping

import yaml

from specfleet.operator.api import ARCH_FIELDS, ModelRef
from specfleet.operator.cost import Architecture, Calibration, GiB

HERE = Path(__file__).parent
SUFFIXES = ("-instruct", "-chat", "-it", "-base")


@dataclass(frozen=True)
class Gpu:
    """One accelerator type; numbers are per device."""

    name: str
    memory_bytes: float
    bandwidth: float            # bytes/s, peak
    flops: float                # bf16 FLOP/s, peak dense
    max_per_node: int
    resource: str | None        # extended resource name, None for cpu
    bandwidth_efficiency: float
    flops_efficiency: float
    t_fixed_s: float

    def calibration(self, count: int) -> Calibration:
        """Starting calibration of a replica of `count` devices (tensor parallel adds sync cost)."""
        sync = 1 + 0.25 * math.log2(count) if count > 1 else 1.0
        return Calibration(bw_eff=self.bandwidth * self.bandwidth_efficiency * count,
                           flops_eff=self.flops * self.flops_efficiency * count,
                           t_fixed=self.t_fixed_s * sync)


GpuCatalog = Mapping[str, Gpu]


@dataclass(frozen=True)
class ModelCatalog:
    """Known architectures by name; `lookup` matches a CR's model source or name."""

    by_name: Mapping[str, Architecture]

    def lookup(self, model: ModelRef) -> Architecture | None:
        if model.architecture is not None:
            return model.architecture
        source = normalize(model.source)
        for key in (source, source.rsplit("/", 1)[-1], normalize(model.name)):
            if key in self.by_name:
                return self.by_name[key]
        return None


def normalize(name: str) -> str:
    """`hf://Meta-Llama/Llama-3.1-8B-Instruct@main` -> `meta-llama/llama-3.1-8b`."""
    key = name.lower().removeprefix("hf://").split("@", 1)[0].rstrip("/")
    for suffix in SUFFIXES:
        key = key.removesuffix(suffix)
    return key


def parse_gpus(raw: Mapping) -> dict[str, Gpu]:
    return {name: _gpu(name, entry) for name, entry in raw.items()}


def _gpu(name: str, e: Mapping) -> Gpu:
    eff = e.get("efficiency", {})
    return Gpu(name=name, memory_bytes=e["memoryGiB"] * GiB, bandwidth=e["hbmBandwidthGBps"] * 1e9,
               flops=e["bf16TFLOPS"] * 1e12, max_per_node=int(e.get("maxPerNode", 8)),
               resource=e.get("resource"), bandwidth_efficiency=eff.get("bandwidth", 0.8),
               flops_efficiency=eff.get("flops", 0.6), t_fixed_s=eff.get("tFixedMs", 3.0) / 1000)


def parse_models(raw: Mapping) -> ModelCatalog:
    by_name: dict[str, Architecture] = {}
    for key, entry in raw.items():
        arch = Architecture(**{py: int(entry["architecture"][k]) for k, py in ARCH_FIELDS.items()})
        for name in [key, *entry.get("names", [])]:
            by_name[normalize(name)] = arch
    return ModelCatalog(by_name)


@lru_cache(maxsize=8)
def gpus(path: str | None = None) -> dict[str, Gpu]:
    return parse_gpus(yaml.safe_load(Path(path or HERE / "gpus.yaml").read_text()))


@lru_cache(maxsize=8)
def models(path: str | None = None) -> ModelCatalog:
    return parse_models(yaml.safe_load(Path(path or HERE / "models.yaml").read_text()))
