"""Small helpers shared by the end-to-end tests (on sys.path through pytest's `pythonpath = ["tests"]`)."""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(probe, timeout: float = 20.0, every: float = 0.1):
    """Poll `probe` until it returns something truthy; fail with its last value."""
    deadline, value = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            value = probe()
        except Exception as exc:  # noqa: BLE001  (not there yet)
            value = exc
        if value and not isinstance(value, Exception):
            return value
        time.sleep(every)
    raise AssertionError(f"timed out; last value: {value!r}")


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split(")")[-1].split()[0] != "Z"
