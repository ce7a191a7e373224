"""The Grafana dashboard (manifests/grafana/dashboard.json) keeps Grafana's conventions, and every
panel's PromQL parses in a real Prometheus once its template variables are substituted."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from prometheus_kit import panel_queries, running_prometheus, substituted, variable_queries

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = json.loads((ROOT / "manifests/grafana/dashboard.json").read_text())
PANELS = DASHBOARD["panels"]
VARIABLES = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GRID_WIDTH = 24


def test_dashboard_identity():
    assert DASHBOARD["uid"] and len(DASHBOARD["uid"]) <= 40
    assert DASHBOARD["title"] and DASHBOARD["schemaVersion"] >= 36
    assert "id" not in DASHBOARD or DASHBOARD["id"] is None     # a provisioned dashboard carries no database id


def test_panels_have_unique_ids_and_refids():
    ids = [p["id"] for p in PANELS]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) and i > 0 for i in ids)
    for panel in PANELS:
        refs = [t["refId"] for t in panel.get("targets", [])]
        assert refs and len(refs) == len(set(refs)), panel["title"]


def test_panels_tile_the_grid_without_overlap():
    taken: set[tuple[int, int]] = set()
    for panel in PANELS:
        g = panel["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= GRID_WIDTH and g["h"] > 0, panel["title"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


def test_every_query_uses_the_datasource_variable():
    assert VARIABLES["datasource"]["type"] == "datasource" and VARIABLES["datasource"]["query"] == "prometheus"
    for panel in PANELS:
        assert panel["datasource"] == DATASOURCE, panel["title"]
        for target in panel["targets"]:
            assert target.get("datasource", DATASOURCE) == DATASOURCE
    for variable in VARIABLES.values():
        if variable["type"] == "query":
            assert variable["datasource"] == DATASOURCE, variable["name"]


def test_every_variable_used_is_defined():
    used = {name for _, expr in panel_queries() for name in re.findall(r"\$\{?(\w+)\}?", expr)}
    used |= {name for v in VARIABLES.values() for name in re.findall(r"\$\{?(\w+)\}?", str(v.get("query", "")))}
    assert used <= set(VARIABLES), f"undefined variables: {used - set(VARIABLES)}"


@pytest.mark.slow
def test_every_expression_parses_in_a_real_prometheus(tmp_path):
    with running_prometheus(tmp_path) as prometheus:
        for where, expr in panel_queries() + variable_queries():
            reply = prometheus.query(substituted(expr))
            assert reply["status"] == "success", f"{where}: {reply.get('error')}"
