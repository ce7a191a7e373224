"""The machine an engine runs on, as a profile records it and the engine reports it.

`host_info` is what a profile's step times depend on (the CPU's name, family/model and vector ISA, the
cores, the torch threads); `profile_format.host_key` reduces it to the key the operator compares: a CPU
profile prices a service only on engines that report the same key (`specfleet:host_info`).
"""
from __future__ import annotations

import os
import platform
from functools import lru_cache
from pathlib import Path

import torch

from specfleet.engine.profile_format import host_key


def host_info() -> dict:
    """The CPU (its name, family/model where the name is masked, as on cloud VMs, and the vector ISA torch
    dispatches to), the cores and the torch threads."""
    info = {"cpu": platform.processor() or platform.machine()}
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        fields = dict(line.split(":", 1) for line in cpuinfo.read_text().split("\n\n", 1)[0].splitlines()
                      if ":" in line)
        fields = {key.strip(): value.strip() for key, value in fields.items()}
        info["cpu"] = fields.get("model name", info["cpu"])
        if "cpu family" in fields and "model" in fields:
            info["family_model"] = f"{fields['cpu family']}/{fields['model']}"
    info["isa"] = torch.backends.cpu.get_cpu_capability()
    return {**info, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads()}


@lru_cache(maxsize=1)
def this_host() -> str:
    """This machine's `host_key`, what the engine's `specfleet:host_info` reports."""
    return host_key(host_info())
