"""Process-level tuning for the CPU path.

Each step allocates tens of MB of short-lived activations (gathered KV context, logits). glibc serves
allocations that large with fresh mmaps, so every step pays page faults on all of it; keeping them
on the heap (and not trimming it back while busy) makes the gathers several times faster on this path.
When the process goes idle, `release_free_memory` hands the free heap pages back to the OS, so the
resident size falls back after a spike instead of keeping its high-water mark.
"""
from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4
_applied = False


def keep_large_allocations_on_heap() -> bool:
    """Best effort, once per process; returns whether glibc accepted the settings."""
    global _applied
    if _applied or not sys.platform.startswith("linux"):
        return _applied
    try:
        libc = ctypes.CDLL("libc.so.6")
        _applied = bool(libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)
                        and libc.mallopt(M_TOP_PAD, 64 << 20))
    except OSError:                      # not glibc (musl, macOS): nothing to do
        _applied = False
    return _applied


def release_free_memory() -> None:
    """Return free heap pages to the OS (glibc malloc_trim); a no-op where the tuning did not apply."""
    if _applied:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
