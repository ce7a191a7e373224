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


def test_a_budget_seeded_from_its_report_reports_the_same_windows_then_slides_on():
    budget = ErrorBudget(objective=0.99)
    good, total = feed(budget, 0, 3600, rps=10, miss=0.001)
    good, total = feed(budget, 3600, 1200, rps=10, miss=0.2, good=good, total=total)
    report = budget.report()
    seeded = ErrorBudget.seeded(0.99, report.windows, report.history_s, t_last=50_000.0)
    again = seeded.report()
    assert again.attainment == report.attainment and again.burn_rate == report.burn_rate
    assert again.at_risk == report.at_risk and again.history_s == pytest.approx(report.history_s)
    last = seeded.samples[-1]
    for b, t0 in ((budget, 4800.0), (seeded, 50_000.0)):          # ten more minutes of good traffic on both
        feed(b, t0, 600, rps=10, miss=0.0, good=b.samples[-1].good, total=b.samples[-1].total)
    moved, original = seeded.report(), budget.report()
    assert moved.attainment["5m"] == original.attainment["5m"] == 1.0
    assert moved.attainment["1h"] == pytest.approx(original.attainment["1h"], abs=0.01)
    assert seeded.samples[-1].total == pytest.approx(last.total + 6000)


def test_restore_carries_the_report_across_the_wall_clock_gap_and_needs_the_counts():
    from specfleet.operator.control.error_budget import restore

    budget = ErrorBudget(objective=0.99)
    feed(budget, 0, 900, rps=10, miss=0.02)
    saved = budget.report().as_status("2026-01-01T00:00:00Z")
    assert saved["windows"]["5m"] == {"met": pytest.approx(2940), "served": pytest.approx(3000)}
    at = 1767225600.0                                               # 2026-01-01T00:00:00Z
    restored = restore(saved, 0.99, now_wall=at + 120, now_t=7.0)   # a 2-minute restart, a new monotonic clock
    assert restored.samples[-1].t == pytest.approx(7.0 - 120)
    assert restored.report().attainment == saved["attainment"]
    legacy = {k: v for k, v in saved.items() if k not in ("windows", "asOf", "historySeconds")}
    assert restore(legacy, 0.99, at, 7.0) is None and restore(None, 0.99, at, 7.0) is None


def test_window_counts_are_those_of_the_first_sample_inside_each_window():
    """The binary search finds the sample a scan from the oldest would (a 6 h history: 1,440 samples)."""
    import random

    rng = random.Random(7)
    budget, t, good, total = ErrorBudget(0.99), 0.0, 0.0, 0.0
    for _ in range(2000):
        t += rng.choice((5.0, 15.0, 15.0, 30.0))
        total += rng.randint(0, 20)
        good = min(total, good + rng.randint(0, 20))
        budget.observe(t, good, total)
        if rng.random() < 0.05:
            for w in (300.0, 1800.0, 3600.0, 21600.0, 1e9):
                last = budget.samples[-1]
                start = next(s for s in budget.samples if s.t >= last.t - w)
                start = budget.samples[-2] if start is last else start
                assert budget.counts(w) == (last.good - start.good, last.total - start.total)
