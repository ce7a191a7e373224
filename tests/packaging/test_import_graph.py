"""The import graph of `specfleet.*` points one way: no upward arrow.

Every module of every source folder that setup.py maps (`SOURCE_FOLDERS`) is parsed with `ast`, imports
inside functions included (a lazy import is still a dependency). Between packages, an import must be an
edge of `ALLOWED`, each with its reason; the engine imports none of the others. Inside the operator, a
module imports only from layers below its own (`OPERATOR_LAYERS`): the pure layers (cost, api, planner,
render, ...) never reach up into the control loop or the kopf handlers. Nothing here runs the modules.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# (importer, imported): why the arrow points down. `None`: any module of the imported package; a set: only those.
ALLOWED: dict[tuple[str, str], tuple[frozenset[str] | None, str]] = {
    ("operator", "engine"): (frozenset({"specfleet.engine.profile_format"}),
                             "the profile file `specfleet engine profile` writes; standard library only"),
    ("sim", "operator"): (None, "the simulator drives the operator's pure layers (planner, control, cost)"),
    ("sim", "engine"): (frozenset({"specfleet.engine.profile_model", "specfleet.engine.profile_format"}),
                        "the simulated engines step at a measured profile's times (the truth), the one measured "
                        "on a given CPU where asked (its recorded host's key)"),
    ("cluster", "operator"): (None, "`specfleet up` plans and applies InferenceServices; the vLLM peer renders "
                                    "its pod's arguments"),
    ("cluster", "engine"): (None, "the node agent runs engine pods; the gateway shares the engine's OpenAI "
                                  "protocol and keys; the load generator reads a built-in model's tokenizer"),
    ("cli", "engine"): (None, "the command line assembles every package"),
    ("cli", "operator"): (None, "the command line assembles every package"),
    ("cli", "cluster"): (None, "the command line assembles every package"),
    ("cli", "sim"): (None, "the command line assembles every package"),
}

# The operator's modules (first name under specfleet.operator), lowest first: each imports only from lower rows.
OPERATOR_LAYERS = (
    {"cost", "threads"},                        # step cost: roofline, profiles, calibration; thread pools
    {"api", "capacity"},                        # the CR's types; the service model
    {"catalogs", "adapters", "kube"},           # shipped catalogs; adapter diffing; the API client shell
    {"planner", "model_folder"},
    {"render", "status"},                       # plan -> pod template; plan -> status conditions
    {"plan_only", "plan_pinning"},              # PlanOnly status; the running sizes kept across releases
    {"control"},                                # the control loop, its pure controllers and its I/O (scrapes)
    {"reconcile"},                              # one reconciliation: plan, render, apply (reads control.loop)
    {"handlers", "leader"},                     # kopf handlers; leader election
    {"main"},
)


def source_folders() -> dict[str, str]:
    """setup.py's SOURCE_FOLDERS (folder -> package), read without running setup.py."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "SOURCE_FOLDERS")
    return ast.literal_eval(node.value)


@functools.cache
def modules() -> dict[str, Path]:
    """Every module name of the mapped source folders -> its file."""
    out = {}
    for folder, package in source_folders().items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            out[".".join((package, *parts))] = path
    return out


def imports_of(name: str, path: Path) -> set[str]:
    """The specfleet modules (or packages) a module imports anywhere in its file; `from P import m` counts as
    P.m where m is a module."""
    known, out = modules(), set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            out |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    return {target for target in out if target.startswith("specfleet.")}


@functools.cache
def graph() -> dict[str, set[str]]:
    return {name: imports_of(name, path) for name, path in modules().items()}


def top(name: str) -> str:
    return name.split(".")[1]


def operator_rank(name: str) -> int:
    first = name.split(".")[2]
    for rank, layer in enumerate(OPERATOR_LAYERS):
        if first in layer:
            return rank
    raise AssertionError(f"{name}: place operator/{first} in OPERATOR_LAYERS")


def package_violations(edges: dict[str, set[str]]) -> list[str]:
    out = []
    for importer, targets in edges.items():
        for target in targets:
            if top(importer) == top(target):
                continue
            rule = ALLOWED.get((top(importer), top(target)))
            if rule is None or (rule[0] is not None and target not in rule[0]):
                out.append(f"{importer} -> {target}")
    return sorted(out)


def operator_violations(edges: dict[str, set[str]]) -> list[str]:
    out = []
    for importer, targets in edges.items():
        if top(importer) != "operator" or importer.count(".") < 2:
            continue
        for target in targets:
            if top(target) != "operator" or target.count(".") < 2:
                continue
            if operator_rank(target) > operator_rank(importer):
                out.append(f"{importer} -> {target}")
    return sorted(out)


def test_every_source_folder_is_read():
    names = modules()
    for folder, package in source_folders().items():
        assert any(name.startswith(package + ".") for name in names), f"{folder}/: no module read"
    assert "specfleet.sim.fleet" in names and "specfleet.operator.control.autoscaler" in names


def test_packages_import_only_downward():
    assert package_violations(graph()) == []


def test_only_the_command_line_imports_the_simulator_and_nothing_imports_the_command_line():
    arrows = {(top(i), top(t)) for i, targets in graph().items() for t in targets if top(i) != top(t)}
    assert {importer for importer, imported in arrows if imported == "sim"} <= {"cli"}
    assert {importer for importer, imported in arrows if imported == "cli"} == set()


def test_operator_layers_import_only_lower_layers():
    assert operator_violations(graph()) == []


def test_the_rules_catch_an_upward_arrow():
    edges = {"specfleet.engine.server.app": {"specfleet.operator.api"},
             "specfleet.operator.api": {"specfleet.sim.run"},
             "specfleet.operator.render": {"specfleet.operator.control.loop", "specfleet.engine.profile_model"},
             "specfleet.operator.cost.roofline": {"specfleet.operator.api"},
             "specfleet.sim.run": {"specfleet.operator.control.loop", "specfleet.cli.main"}}
    assert package_violations(edges) == ["specfleet.engine.server.app -> specfleet.operator.api",
                                         "specfleet.operator.api -> specfleet.sim.run",
                                         "specfleet.operator.render -> specfleet.engine.profile_model",
                                         "specfleet.sim.run -> specfleet.cli.main"]
    assert operator_violations(edges) == ["specfleet.operator.cost.roofline -> specfleet.operator.api",
                                          "specfleet.operator.render -> specfleet.operator.control.loop"]


def test_function_local_and_relative_imports_count(tmp_path):
    path = tmp_path / "mod.py"
    path.write_text("def f():\n    from specfleet.operator import planner\n"
                    "    import specfleet.sim.run\n    from . import render\n")
    assert imports_of("specfleet.operator.x", path) == {"specfleet.operator.planner", "specfleet.sim.run",
                                                        "specfleet.operator.render"}
