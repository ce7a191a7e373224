"""The SLO burn-rate alerts (manifests/prometheus/rules.yaml) through the real `promtool`: the rules parse,
and their unit tests (slo_alerts_test.yaml) hold: a fast burn pages within its window, a healthy service
never fires, a recovering one resolves, a slow burn tickets without paging, the operator's objective sets
the budget. CI installs Prometheus (`.ci/run`); elsewhere the promtool tests skip without it."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from prometheus_kit import required_binary

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "manifests/prometheus/rules.yaml"
UNIT_TESTS = Path(__file__).with_name("slo_alerts_test.yaml")
RUNBOOKS = ROOT / "docs/runbooks.md"


def promtool() -> str:
    return required_binary("promtool")


def rule_groups() -> dict:
    rule = yaml.safe_load(RULES.read_text())
    assert rule["kind"] == "PrometheusRule" and rule["apiVersion"] == "monitoring.coreos.com/v1"
    return rule["spec"]


@pytest.fixture
def rules_dir(tmp_path: Path) -> Path:
    """The PrometheusRule's groups as the plain rule file promtool reads, beside the unit tests."""
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rule_groups(), sort_keys=False))
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    return tmp_path


def test_promtool_checks_the_rules(rules_dir: Path):
    out = subprocess.run([promtool(), "check", "rules", str(rules_dir / "rules.yml")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_promtool_unit_tests_pass(rules_dir: Path):
    out = subprocess.run([promtool(), "test", "rules", UNIT_TESTS.name], cwd=rules_dir,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_broken_expectation_fails(rules_dir: Path):
    """The unit tests can fail: a healthy expectation for the fast-burn scenario is refused."""
    tests = yaml.safe_load((rules_dir / UNIT_TESTS.name).read_text())
    fast = next(t for t in tests["tests"] if t["name"] == "fast burn pages")
    fast["alert_rule_test"] = [{"eval_time": "10m", "alertname": "SpecfleetErrorBudgetFastBurn", "exp_alerts": []}]
    fast.pop("promql_expr_test")
    tests["tests"] = [fast]
    (rules_dir / "broken.yaml").write_text(yaml.safe_dump(tests))
    out = subprocess.run([promtool(), "test", "rules", "broken.yaml"], cwd=rules_dir,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "SpecfleetErrorBudgetFastBurn" in out.stdout + out.stderr


def alerts() -> list[dict]:
    return [r for g in rule_groups()["groups"] for r in g["rules"] if "alert" in r]


def test_every_alert_pages_or_tickets_with_a_runbook():
    anchors = {re.sub(r"[^a-z0-9-]", "", line.lstrip("#").strip().lower().replace(" ", "-"))
               for line in RUNBOOKS.read_text().splitlines() if line.startswith("#")}
    assert {a["alert"] for a in alerts()} == {"SpecfleetErrorBudgetFastBurn", "SpecfleetErrorBudgetSlowBurn"}
    for alert in alerts():
        assert alert["labels"]["severity"] in ("page", "ticket")
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]
        anchor = alert["annotations"]["runbook_url"].rsplit("#", 1)[1]
        assert anchor in anchors, f"{alert['alert']}: docs/runbooks.md has no section #{anchor}"


def test_burn_rate_windows_follow_the_sre_workbook():
    """Page at 14.4x over 1h/5m and 6x over 6h/30m; ticket at 3x over 1d/2h and 1x over 3d/6h."""
    pairs = {a["alert"]: re.findall(r"slo_burn_rate:(\w+) > ([\d.]+)", a["expr"]) for a in alerts()}
    assert pairs["SpecfleetErrorBudgetFastBurn"] == [("1h", "14.4"), ("5m", "14.4"), ("6h", "6"), ("30m", "6")]
    assert pairs["SpecfleetErrorBudgetSlowBurn"] == [("1d", "3"), ("2h", "3"), ("3d", "1"), ("6h", "1")]
