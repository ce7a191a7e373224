"""What a benchmark's JSON records about where it ran: the machine and the commit (`+dirty` with local edits)."""
from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def machine() -> dict:
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu": cpu_model(), "cpus": os.cpu_count(), "python": platform.python_version()}


def cpu_model() -> str | None:
    """The CPU's model name (Linux): two hosts with the same `processor` and CPU count here differed 3x in
    the operator's figures."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)


def commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    return out.stdout.strip() + ("+dirty" if dirty else "")


def repo_path(path: Path | str) -> str:
    """`path` as results files record it: relative to the repository where it lies inside it."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def stamp(script: str, argv: list[str]) -> dict:
    """The fields every results file carries: the command that wrote it, the commit, the machine, the date."""
    return {"command": " ".join([".venv/bin/python", script, *argv]), "commit": commit(), "machine": machine(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
