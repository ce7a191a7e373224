"""The `operator/` source folder never shadows the standard library's `operator` module: from the
repository root, a Python that puts the current folder on `sys.path` (`python -c`, `python -m`, as
tools such as vLLM spawn them) gets the standard library's module, while `specfleet.operator` still
imports from the editable install. The folder has no `__init__.py`: it is only a namespace-package
candidate there, and a regular module found later on `sys.path` wins over it."""
from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STDLIB_OPERATOR = str(Path(sysconfig.get_paths()["stdlib"]) / "operator.py")


def run(*args: str) -> str:
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_python_without_site_at_the_repository_root_imports_the_stdlib_operator():
    assert run("-S", "-c", "import operator; print(operator.__file__)").strip() == STDLIB_OPERATOR


def test_a_python_dash_m_tool_at_the_repository_root_sees_the_stdlib_operator():
    out = run("-m", "pydoc", "operator")
    assert STDLIB_OPERATOR in out and "specfleet" not in out


def test_specfleet_operator_still_imports_from_the_source_folder():
    out = run("-c", "import operator, specfleet.operator.api as api; print(operator.__file__); print(api.__file__)")
    assert out.split() == [STDLIB_OPERATOR, str(ROOT / "operator/api.py")]
