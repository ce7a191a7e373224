"""Child processes that cannot outlive `specfleet up`: the operator and every engine process.

`up` stops them itself on every way out it sees (signals, a closed stdout); `die_with_parent()`, run in
the child between fork and exec, covers the ways it cannot see (SIGKILL, a crash): Linux's
PR_SET_PDEATHSIG sends the child SIGKILL when the thread that started it ends.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
# Resolved here, not in the child: between fork and exec only async-signal-safe work is wise.
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def die_with_parent() -> Callable[[], None]:
    """A `preexec_fn` for a child of this process: SIGKILL the child when this process ends (Linux)."""
    parent = os.getpid()

    def arm() -> None:
        if _prctl is None:
            return
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:      # the parent ended before the request took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return arm


def kill_group(pid: int, sig: int) -> None:
    """Signal a child's whole process group (children run in their own session); gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
