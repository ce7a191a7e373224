"""CPU attention: C++ paged-attention kernels for decodes and verifications and for prefill chunks.

The torch reference path gathers every sequence's blocks into a padded copy and permutes it for the
batched matmuls: three copies of the whole context per layer and step, which is most of a CPU decode
step. `paged_attention.cpp` reads K/V in place through the block table instead. Prefill chunks go to
`prefill_attention.cpp`, causal tiles that skip the keys a query cannot see (SDPA scores them and masks);
what it does not cover (not fp32 or bf16, an odd head size, no 8-wide vectors) keeps SDPA. It is compiled
once per machine with torch's cpp_extension (g++ and ninja) into `kernel_build_dir()`, under the specfleet
cache; where that is impossible the engine logs why and keeps the torch path. The same extension carries
the step's K/V cache write (`write_kv`, in `paged_attention.cpp`: one copy per token, where index_copy_
took several times as long), the decoder's fused elementwise steps (`fused_ops.cpp`), the few-row
linears (`linear_small.cpp`, `linear_panels.cpp`) and the multi-LoRA op (`lora.cpp`), with `vec_math.h`
inlined into each.
"""
from __future__ import annotations

import fcntl
import hashlib
import logging
import platform
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import torch

from specfleet.engine.attention import SHORT_QUERY, AttentionGroup, TorchPagedAttention

log = logging.getLogger(__name__)
SOURCES = [Path(__file__).with_name(name) for name in ("paged_attention.cpp", "prefill_attention.cpp", "fused_ops.cpp",
                                                       "linear_small.cpp", "linear_panels.cpp", "lora.cpp")]
HEADER = Path(__file__).with_name("vec_math.h")
# -fno-trapping-math lets GCC if-convert vec_math.h's clamps, so its loops vectorize
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math"]
FUNCTIONS = ["paged_attention_short", "paged_attention_prefill", "write_kv", "rms_norm", "add_rms_norm", "silu_and_mul", "rotary",
             "linear_small", "pack_panels", "linear_panels", "lora_add"]
_lock = threading.Lock()
_module = None
_error: str | None = None


def load_kernel():
    """The compiled extension module, built on first use; None (with the reason logged) if it cannot be."""
    global _module, _error
    with _lock:
        if _module is None and _error is None:
            try:
                from torch.utils.cpp_extension import load_inline

                build_dir = kernel_build_dir()
                build_dir.mkdir(parents=True, exist_ok=True)
                with builder_lock(build_dir):
                    _module = load_inline(name="specfleet_cpu_attention", cpp_sources=[_source(p) for p in SOURCES],
                                          functions=FUNCTIONS, build_directory=str(build_dir), extra_cflags=CFLAGS,
                                          extra_ldflags=["-fopenmp"])
            except Exception as exc:        # no compiler, no ninja, read-only home: fall back, say why
                _error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
                log.warning("CPU attention kernel unavailable, using the torch path: %s", _error)
        return _module


@contextmanager
def builder_lock(build_dir: Path):
    """One builder at a time per build folder, on an OS lock that dies with its holder. torch's own lock
    is a file that a builder killed mid-compile leaves behind, and every later load then waits on it
    for ever; under this lock no other builder is running, so such a file is stale and is removed."""
    with open(build_dir / "specfleet-build.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            stale = build_dir / "lock"
            if stale.exists():
                log.warning("removing a stale build lock left by an interrupted build: %s", stale)
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _source(path: Path) -> str:
    """The file's text with `vec_math.h` inlined: the extension's hash covers what it includes, so an
    edit to the header rebuilds it (include guards keep the second copy empty)."""
    return inline_header(path.read_text(), HEADER.read_text())


def inline_header(source: str, header: str) -> str:
    """`source` with its `#include "vec_math.h"` replaced by `header`'s text."""
    return source.replace(f'#include "{HEADER.name}"', header)


def kernel_build_dir() -> Path:
    """Per torch installation, Python version and CPU (the build is -march=native) under the specfleet
    cache, which local-fleet pods share (their HOME is a per-pod /tmp): compiled once per machine, not per
    pod. The torch installation's folder is part of the key because the build files name its headers and
    libraries: two virtual environments sharing one folder would rebuild it for each other."""
    from specfleet.engine.builtin import cache_root

    python = f"py{sys.version_info[0]}{sys.version_info[1]}"
    install = hashlib.sha1(str(Path(torch.__file__).resolve().parent).encode()).hexdigest()[:8]
    return cache_root() / "kernels" / f"cpu_attention-torch{torch.__version__}-{install}-{python}-{cpu_tag()}"


def cpu_tag() -> str:
    """A short fingerprint of the CPU model and its instruction-set flags."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        info = platform.processor()
    lines = [line for line in info.splitlines() if line.startswith(("model name", "flags", "Features"))][:2]
    return hashlib.sha1("\n".join(lines or [platform.machine()]).encode()).hexdigest()[:10]


def available() -> bool:
    return load_kernel() is not None


def build_error() -> str | None:
    """Why the kernel could not be built, once `load_kernel` has tried."""
    return _error


class CpuPagedAttention(TorchPagedAttention):
    """Short-query groups and prefill chunks through the C++ kernels; the torch (SDPA) path for chunks the
    prefill kernel does not cover (it answers an empty tensor)."""

    def __init__(self, scale: float, prefill_kernel: bool = True) -> None:
        super().__init__(scale)
        self.kernel = load_kernel()
        self.prefill_kernel = prefill_kernel      # False: prefill chunks through SDPA (benchmarks compare)
        self.write_kv = self.kernel.write_kv      # the step's K/V into their slots, as attention.write_kv

    def _group(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               group: AttentionGroup) -> torch.Tensor:
        if group.query_len > SHORT_QUERY:
            if not self.prefill_kernel:
                return super()._group(q, k_cache, v_cache, group)
            out = self.kernel.paged_attention_prefill(q, k_cache, v_cache, group.block_tables, group.context_lens,
                                                      group.query_len, self.scale)
            return out if out.numel() else super()._group(q, k_cache, v_cache, group)
        return self.kernel.paged_attention_short(q, k_cache, v_cache, group.block_tables, group.context_lens,
                                                 group.query_len, self.scale)
