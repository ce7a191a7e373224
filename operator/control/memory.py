"""Settling the operator's memory once a burst of services has been taken in.

A burst (thousands of InferenceServices created at once) leaves two costs behind: the allocator keeps the
pages the burst's temporaries freed (reconciles run on kopf's worker threads, each with its own glibc
arena), so the resident size stays at the burst's peak; and every object the fleet keeps for good (kopf's
per-object state, the loops' state) is scanned again by each full garbage collection, which the control
steps' allocations trigger every few intervals. `settle` collects everything (what an earlier settle
froze included), moves what survived out of the collector's view (`gc.freeze`: until the next settle, a
cycle among those objects is not collected; refcounting still frees them) and hands free pages back to
the kernel (`malloc_trim(0)`, glibc only; elsewhere a no-op).

`BurstWatch` says when to: the tracked count grew by at least `min_growth` and then held still for a
whole check in which the process was mostly idle (under `quiet` of a core: the burst's reconciles are
done), or `every_s` passed since the last settle (cyclic garbage among frozen objects waits no
longer than that).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import time
from dataclasses import dataclass

log = logging.getLogger("specfleet.operator.control")


def _libc_function(name: str):
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):        # not glibc
        return None


_TRIM = _libc_function("malloc_trim")


def settle() -> None:
    """Collect, freeze the survivors, return free heap pages to the kernel."""
    started = time.perf_counter()
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    if _TRIM is not None:
        _TRIM(0)
    log.info("memory settled in %.2f s: %d objects out of the collector's view", time.perf_counter() - started,
             gc.get_freeze_count())


@dataclass
class BurstWatch:
    """Fed the tracked count at each check; `settled` is True once after a burst has ended."""

    min_growth: int = 100
    every_s: float = 600.0
    quiet: float = 0.5
    settled_at: int = 0
    last: int = 0
    last_time: float | None = None

    def settled(self, count: int, now: float, busy: float = 0.0) -> bool:
        """`busy`: the process's CPU over the last check, in cores."""
        still, self.last = count == self.last, count
        if self.last_time is None:
            self.last_time = now
        ended = still and busy < self.quiet and count - self.settled_at >= self.min_growth
        if ended or now - self.last_time >= self.every_s:
            self.settled_at, self.last_time = count, now
            return True
        if count < self.settled_at:         # services went: a later burst counts from here
            self.settled_at = count
        return False
