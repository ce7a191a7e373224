"""The engine package's layout: every module says what it holds, subpackage `__init__` files hold no
code, and the public names stay importable without pulling torch into processes that only need config."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "engine"


def test_every_engine_module_has_a_docstring():
    missing = [str(p.relative_to(ENGINE)) for p in ENGINE.rglob("*.py")
               if not ast.get_docstring(ast.parse(p.read_text(encoding="utf-8")))]
    assert missing == []


def test_subpackage_init_files_hold_only_a_docstring():
    with_code = []
    for init in ENGINE.glob("*/__init__.py"):
        body = ast.parse(init.read_text(encoding="utf-8")).body
        if len(body) != 1 or not isinstance(body[0], ast.Expr) or not isinstance(body[0].value, ast.Constant):
            with_code.append(str(init.relative_to(ENGINE)))
    assert with_code == []


def test_speculative_decoding_lives_in_engine_speculative():
    assert not (ENGINE / "spec").exists()
    assert {p.name for p in (ENGINE / "speculative").glob("*.py")} >= {"ngram.py", "draft.py", "rejection.py",
                                                                        "speculator.py", "control.py"}


def test_config_imports_without_torch_and_public_names_resolve():
    probe = ("import sys, specfleet.engine.config, specfleet.engine.builtin; assert 'torch' not in sys.modules; "
             "from specfleet.engine import LLM, LLMEngine, EngineConfig, SamplingParams, RequestOutput; "
             "print(LLM.__module__, EngineConfig.__module__)")
    out = subprocess.run([sys.executable, "-c", probe], cwd="/tmp", capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["specfleet.engine.llm", "specfleet.engine.config"]
