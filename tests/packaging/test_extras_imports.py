"""The operator and the gateway start without the engine's packages: their images install only their own
extra (`.[operator]`, `.[gateway]`), which has no numpy and no torch.

Each test runs a fresh interpreter in which every package of the engine extra that the component's extra
does not list (and numpy, scipy) is unimportable, imports the component's entry modules as
`specfleet operator run` / `specfleet gateway run` do, and runs what the operator does first with an
InferenceService: load the catalogs (the measured profiles included), plan and render it. The fresh
virtual environments of tests/packaging/test_images.py check the same end to end; this is the quick check.
"""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

from images_kit import ROOT, extra_requirements

ALWAYS_BLOCKED = ("numpy", "scipy")      # not in any runtime extra, but in the dev environment

BLOCKER = """
import sys
BLOCKED = {blocked!r}
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked: not in the {extra} extra)")
sys.meta_path.insert(0, Blocker())
"""

OPERATOR = """
import yaml
import specfleet.cli.main, specfleet.operator.main, specfleet.operator.handlers
from specfleet.operator import api, catalogs, planner, render
doc = yaml.safe_load(open({example!r}))
spec = api.parse_spec(doc["spec"])
assert catalogs.profiles().entries, "no measured profile was loaded"
plan = planner.plan(spec, catalogs.gpus(), catalogs.models(), catalogs.profiles())
assert plan.profile is not None and plan.calibration.source == "profile", plan.calibration
render.render("smollm2-cpu", "default", spec, plan)
"""

GATEWAY = """
import specfleet.cli.main, specfleet.cli.gateway_cmds
from specfleet.cluster.gateway import Gateway, GatewayConfig
from specfleet.cluster.gateway.connect import connect
from specfleet.cluster.gateway.keys import ApiKeys
"""


def module_names(requirements: list[str]) -> set[str]:
    """`uvicorn[standard]>=0.29` -> uvicorn, `prometheus-client` -> prometheus_client."""
    return {re.split(r"[\[<>=!~ ;]", r, maxsplit=1)[0].lower().replace("-", "_") for r in requirements}


def blocked_for(extra: str) -> set[str]:
    allowed = module_names(extra_requirements(extra)) | {"yaml", "typer", "rich"}
    return (module_names(extra_requirements("engine")) | set(ALWAYS_BLOCKED)) - allowed


def run_blocked(extra: str, code: str) -> subprocess.CompletedProcess:
    script = textwrap.dedent(BLOCKER.format(blocked=sorted(blocked_for(extra)), extra=extra)) + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_the_blocked_packages_include_numpy_and_torch_and_spare_the_extra_s_own():
    assert {"numpy", "torch", "transformers"} <= blocked_for("operator")
    assert not blocked_for("operator") & {"kopf", "kubernetes", "httpx", "prometheus_client"}
    assert {"numpy", "torch", "fastapi"} <= blocked_for("gateway") and "aiohttp" not in blocked_for("gateway")


def test_the_blocker_blocks():
    done = run_blocked("operator", "import numpy")
    assert done.returncode != 0 and "blocked: not in the operator extra" in done.stderr


def test_the_operator_starts_plans_and_renders_without_numpy_or_torch():
    example = str(ROOT / "manifests/examples/smollm2-cpu.yaml")
    done = run_blocked("operator", OPERATOR.format(example=example))
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_gateway_starts_without_numpy_or_torch():
    done = run_blocked("gateway", GATEWAY)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("module", ["specfleet.engine.profile_format", "specfleet.operator.cost",
                                    "specfleet.operator.catalogs"])
def test_the_profile_format_is_pure_python(module):
    done = run_blocked("operator", f"import {module}")
    assert done.returncode == 0, done.stderr[-3000:]


def test_simulate_says_what_it_needs_where_the_simulator_cannot_import():
    done = run_blocked("operator", """
        from typer.testing import CliRunner
        from specfleet.cli.main import app
        result = CliRunner().invoke(app, ["simulate", "--scenario", "steady"])
        print(result.exit_code, result.output)
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("1 "), done.stdout
    assert "cannot import the simulator (No module named 'numpy'" in done.stdout, done.stdout
