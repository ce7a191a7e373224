"""Error budgets: attainment per window, burn rate, and the multi-window fast/slow burn alert."""
from __future__ import annotations

import pytest

from specfleet.operator.control.error_budget import ErrorBudget, window_label


def feed(budget: ErrorBudget, start: float, seconds: float, rps: float, miss: float,
         good: float = 0.0, total: float = 0.0, step: float = 15.0) -> tuple[float, float]:
    """Cumulative counts for `seconds` of traffic at `rps` with a fraction `miss` missing the SLO."""
    t = start
    while t < start + seconds:
        t += step
        total += rps * step
        good += rps * step * (1 - miss)
        budget.observe(t, good, total)
    return good, total


def test_burn_rate_is_the_missed_fraction_over_the_allowed_fraction():
    budget = ErrorBudget(objective=0.99)
    feed(budget, 0, 600, rps=10, miss=0.05)
    assert budget.burn_rate(300) == pytest.approx(5.0)
    assert budget.report().attainment["5m"] == pytest.approx(0.95)


def test_no_requests_means_no_burn_and_no_alert():
    budget = ErrorBudget(objective=0.99)
    feed(budget, 0, 600, rps=0, miss=0)
    report = budget.report()
    assert budget.burn_rate(300) is None and not report.at_risk and report.attainment == {}


def test_a_sustained_fast_burn_is_at_risk():
    budget = ErrorBudget(objective=0.99)
    good, total = feed(budget, 0, 3600, rps=10, miss=0.001)
    feed(budget, 3600, 900, rps=10, miss=0.9, good=good, total=total)
    report = budget.report()
    assert report.at_risk and report.reason.startswith("fast burn")


def test_a_short_spike_inside_a_healthy_hour_is_not_at_risk():
    budget = ErrorBudget(objective=0.99)
    good, total = feed(budget, 0, 3600, rps=10, miss=0.0)
    feed(budget, 3600, 60, rps=10, miss=1.0, good=good, total=total)
    assert budget.burn_rate(300) > 14.4 and budget.burn_rate(3600) < 14.4
    assert not budget.report().at_risk


def test_the_alert_clears_soon_after_the_burn_stops():
    budget = ErrorBudget(objective=0.99)
    good, total = feed(budget, 0, 1800, rps=10, miss=0.5)
    assert budget.report().at_risk
    good, total = feed(budget, 1800, 600, rps=10, miss=0.0, good=good, total=total)
    assert budget.report().reason.startswith("slow burn")       # the fast alert's 5-minute window is clean
    feed(budget, 2400, 1800, rps=10, miss=0.0, good=good, total=total)
    assert not budget.report().at_risk                          # and so is the slow alert's 30-minute one


def test_history_older_than_the_longest_window_is_dropped():
    budget = ErrorBudget(objective=0.999)
    feed(budget, 0, 30000, rps=1, miss=0, step=60)
    assert budget.samples[-1].t - budget.samples[1].t <= 21600


def test_window_labels():
    assert [window_label(s) for s in (300, 1800, 3600, 21600)] == ["5m", "30m", "1h", "6h"]
