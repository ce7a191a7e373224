"""RowLimitStore: the few-row linears' row limits, measured once per machine and kept in the cache.

`calibrate_small_rows` times `linear_small` against oneDNN when a model loads, and the timing is noisy:
two processes on one machine can pick other limits for one shape, so they run the same rows on
different kernels, which sum in different orders. In bf16 that rounding picks other tokens now and
then, so a server and an offline `LLM` on one host disagreed on a greedy output. Every process on a
machine now reads the limits the first one measured. The file is keyed by the CPU, the torch version
and the few-row kernel's source, so an upgrade of either measures again; delete it to re-measure.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import logging
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from specfleet.engine.builtin import cache_root
from specfleet.engine.cpu.attention import cpu_tag

log = logging.getLogger(__name__)
KERNEL_SOURCES = ("linear_small.cpp", "linear_panels.cpp", "vec_math.h")


@dataclass(frozen=True)
class RowLimitStore:
    path: Path

    @classmethod
    def for_this_machine(cls) -> RowLimitStore:
        source = "".join(Path(__file__).with_name(name).read_text() for name in KERNEL_SOURCES)
        kernel = hashlib.sha1(source.encode()).hexdigest()[:8]
        return cls(cache_root() / "row-limits" / f"torch{torch.__version__}-{cpu_tag()}-{kernel}.json")

    @staticmethod
    def key(in_features: int, out_features: int, dtype: torch.dtype) -> str:
        return f"{str(dtype).removeprefix('torch.')}:{in_features}x{out_features}"

    def load(self) -> dict[str, int]:
        """The stored limits; {} when there are none or the file cannot be read (then they are measured)."""
        try:
            stored = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable row limits %s: %s", self.path, exc)
            return {}
        return {k: v for k, v in stored.items() if isinstance(v, int) and v >= 0} if isinstance(stored, dict) else {}

    def save(self, limits: dict[str, int]) -> None:
        """Written whole to a temporary file and renamed, so a reader never sees half of it."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial = self.path.with_suffix(".partial")
            partial.write_text(json.dumps(limits, indent=1, sort_keys=True))
            partial.replace(self.path)
        except OSError as exc:                  # a read-only cache: the limits hold for this process only
            log.warning("could not keep row limits in %s: %s", self.path, exc)

    @contextmanager
    def locked(self):
        """One measuring process at a time per machine: a second one waits, then reads what the first kept
        (and does not time its kernels while the first is busy on the same cores)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(self.path.with_suffix(".lock"), "w")
        except OSError:
            yield
            return
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
