"""CPU attention: a C++ paged-attention kernel for decodes and verifications, torch SDPA for prefills.

The torch reference path gathers every sequence's blocks into a padded copy and permutes it for the
batched matmuls: three copies of the whole context per layer and step, which is most of a CPU decode
step. `paged_attention.cpp` reads K/V in place through the block table instead. It is compiled once per
machine with torch's cpp_extension (g++ and ninja) into `kernel_build_dir()`, under the specfleet cache;
where that is impossible the engine logs why and keeps the torch path. The same extension carries the
decoder's fused elementwise steps (`fused_ops.cpp`) and the few-row linear (`linear_small.cpp`), with
`vec_math.h` inlined into each.
"""
from __future__ import annotations

import hashlib
import logging
import platform
import sys
import threading
from pathlib import Path

import torch

from specfleet.engine.attention import SHORT_QUERY, AttentionGroup, TorchPagedAttention

log = logging.getLogger(__name__)
SOURCES = [Path(__file__).with_name(name) for name in ("paged_attention.cpp", "fused_ops.cpp", "linear_small.cpp")]
HEADER = Path(__file__).with_name("vec_math.h")
# -fno-trapping-math lets GCC if-convert vec_math.h's clamps, so its loops vectorize
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math"]
FUNCTIONS = ["paged_attention_short", "rms_norm", "add_rms_norm", "silu_and_mul", "rotary", "linear_small"]
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
                _module = load_inline(name="specfleet_cpu_attention", cpp_sources=[_source(p) for p in SOURCES],
                                      functions=FUNCTIONS, build_directory=str(build_dir), extra_cflags=CFLAGS,
                                      extra_ldflags=["-fopenmp"])
            except Exception as exc:        # no compiler, no ninja, read-only home: fall back, say why
                _error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
                log.warning("CPU attention kernel unavailable, using the torch path: %s", _error)
        return _module


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
    return cache_root() / "kernels" / f"cpu_attention-torch{torch.__version__}-{install}-{python}-{_cpu_tag()}"


def _cpu_tag() -> str:
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
    """Short-query groups through the C++ kernel; prefill chunks through the torch (SDPA) path."""

    def __init__(self, scale: float) -> None:
        super().__init__(scale)
        self.kernel = load_kernel()

    def _group(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               group: AttentionGroup) -> torch.Tensor:
        if group.query_len > SHORT_QUERY:
            return super()._group(q, k_cache, v_cache, group)
        return self.kernel.paged_attention_short(q, k_cache, v_cache, group.block_tables, group.context_lens,
                                                 group.query_len, self.scale)
