"""SLO error budgets: attainment over rolling windows and how fast the budget burns.

An objective of 0.99 allows 1% of requests to miss their TTFT or ITL target: that 1% is the error
budget. The burn rate over a window is the fraction that missed divided by the fraction allowed, so
1.0 spends the budget exactly over the SLO period and 14.4 spends a 30-day budget in about two days.
Alerts follow the multi-window, multi-burn-rate scheme: a fast burn must show over a long window
(it matters) and a short one (it is still happening), which keeps one slow request from paging and
lets an alert clear soon after the burn stops.

Pure: the caller feeds cumulative counts (requests that met both targets, requests in all) with their
time; `FleetCounts` folds the pods' counters into those, a pod restart's reset included.

The report carries each window's counts and the history's length, so an operator that restarts seeds
its windows from `status.errorBudget` (`restore`) instead of starting them empty: the counts between
two window edges are spread evenly over that span, which gives every window exactly its reported
counts at the moment of the report, and the windows slide on from there.
"""
from __future__ import annotations

import bisect
import datetime as dt
from collections import deque
from dataclasses import dataclass, field

WINDOWS_S = (300.0, 1800.0, 3600.0, 21600.0)      # 5m, 30m, 1h, 6h
FAST_BURN = (3600.0, 300.0, 14.4)                 # long window, short window, burn-rate threshold
SLOW_BURN = (21600.0, 1800.0, 6.0)
SEED_STEP_S = 60.0                                # spacing of the samples a restore lays between window edges


@dataclass(frozen=True)
class BudgetSample:
    t: float          # seconds, monotonic or wall: only differences matter
    good: float       # cumulative requests that met both TTFT and ITL targets
    total: float      # cumulative finished requests


@dataclass(frozen=True)
class BudgetReport:
    objective: float
    attainment: dict[str, float]       # window label -> fraction of good requests (windows with requests only)
    burn_rate: dict[str, float]        # window label -> burn rate
    at_risk: bool
    reason: str
    burn: str = ""                     # "fast" | "slow" while at risk, else ""
    windows: dict[str, tuple[float, float]] = field(default_factory=dict)   # label -> (met, served)
    history_s: float = 0.0             # how far back the samples reach (a window longer than it covers it all)

    def as_status(self, as_of: str | None = None) -> dict:
        """`status.errorBudget`; with `as_of` (the report's wall time, RFC 3339) also the counts behind
        each window and the history's length, what `restore` seeds a restarted operator's windows from."""
        out = {"objective": self.objective, "attainment": self.attainment, "burnRate": self.burn_rate,
               "atRisk": self.at_risk, "reason": self.reason}
        if as_of is not None:
            out.update(windows={label: {"met": round(met, 3), "served": round(served, 3)}
                                for label, (met, served) in self.windows.items()},
                       historySeconds=round(self.history_s, 1), asOf=as_of)
        return out


def _time_of(sample: BudgetSample) -> float:
    return sample.t


def window_label(seconds: float) -> str:
    return f"{int(seconds // 3600)}h" if seconds >= 3600 else f"{int(seconds // 60)}m"


@dataclass
class ErrorBudget:
    """Rolling cumulative counts of one service; keeps just enough history for the longest window."""

    objective: float
    samples: deque[BudgetSample] = field(default_factory=deque)

    def observe(self, t: float, good: float, total: float) -> None:
        if self.samples and t <= self.samples[-1].t:
            return
        self.samples.append(BudgetSample(t, good, total))
        horizon = t - max(WINDOWS_S)
        while len(self.samples) > 2 and self.samples[1].t <= horizon:
            self.samples.popleft()

    def counts(self, window_s: float) -> tuple[float, float]:
        """(good, total) over the last `window_s`, or over the history there is if it is shorter. A binary
        search for the window's first sample: a 6 h history at a 15 s interval holds 1,440 of them."""
        if len(self.samples) < 2:
            return 0.0, 0.0
        last = self.samples[-1]
        i = bisect.bisect_left(self.samples, last.t - window_s, key=_time_of)
        start = self.samples[min(i, len(self.samples) - 2)]
        return last.good - start.good, last.total - start.total

    def burn_rate(self, window_s: float) -> float | None:
        return self._burn(self.counts(window_s))

    def _burn(self, counts: tuple[float, float]) -> float | None:
        good, total = counts
        if total <= 0:
            return None
        return (1.0 - good / total) / max(1.0 - self.objective, 1e-9)

    def report(self) -> BudgetReport:
        attainment, burn_rates, windows = {}, {}, {}
        counts = {w: self.counts(w) for w in {*WINDOWS_S, *FAST_BURN[:2], *SLOW_BURN[:2]}}
        for w in WINDOWS_S:
            good, total = counts[w]
            if total > 0:
                attainment[window_label(w)] = round(good / total, 5)
                burn_rates[window_label(w)] = round(self._burn(counts[w]), 3)
                windows[window_label(w)] = (good, total)
        at_risk, reason, burn = False, "", ""
        for name, (long_w, short_w, threshold) in (("fast", FAST_BURN), ("slow", SLOW_BURN)):
            long_b, short_b = self._burn(counts[long_w]), self._burn(counts[short_w])
            if long_b is not None and short_b is not None and min(long_b, short_b) > threshold:
                at_risk, burn = True, name
                reason = (f"{name} burn: {long_b:.1f}x over {window_label(long_w)} and {short_b:.1f}x over "
                          f"{window_label(short_w)} (threshold {threshold}x of a {self.objective:g} objective)")
                break
        history_s = self.samples[-1].t - self.samples[0].t if self.samples else 0.0
        return BudgetReport(self.objective, attainment, burn_rates, at_risk, reason, burn, windows, history_s)

    @classmethod
    def seeded(cls, objective: float, windows: dict[str, tuple[float, float]], history_s: float,
               t_last: float) -> "ErrorBudget":
        """A budget whose windows hold `windows` (label -> (met, served)) at `t_last`, over a history of
        `history_s`; its cumulative counts end at the longest window's (`FleetCounts` goes on from there)."""
        budget = cls(objective)
        if not windows:
            return budget
        span = min(max(history_s, 0.0), max(WINDOWS_S))
        met_all, served_all = max(windows.values(), key=lambda c: c[1])
        edges = {t_last - span: (0.0, 0.0), t_last: (met_all, served_all)}
        for w in WINDOWS_S:
            if w < span and window_label(w) in windows:
                met, served = windows[window_label(w)]
                edges[t_last - w] = (max(0.0, met_all - met), max(0.0, served_all - served))
        points = sorted(edges.items())
        for (t0, (g0, n0)), (t1, (g1, n1)) in zip(points, points[1:]):
            steps = max(1, int((t1 - t0) // SEED_STEP_S))
            for i in range(steps):
                f = i / steps
                budget.samples.append(BudgetSample(t0 + f * (t1 - t0) if i else t0, g0 + f * (g1 - g0),
                                                   n0 + f * (n1 - n0)))
        budget.samples.append(BudgetSample(t_last, met_all, served_all))
        return budget


def restore(saved: dict | None, objective: float, now_wall: float, now_t: float) -> ErrorBudget | None:
    """The budget a restarted operator goes on with, from the `status.errorBudget` an earlier one wrote
    (`as_status(as_of)`), its age measured on the wall clock and carried onto the caller's clock `now_t`;
    None when status holds no counts (a status from before they were written: the windows start empty)."""
    saved = saved or {}
    try:
        windows = {label: (float(c["met"]), float(c["served"])) for label, c in (saved.get("windows") or {}).items()}
        as_of = dt.datetime.fromisoformat(saved["asOf"].replace("Z", "+00:00")).timestamp()
        history_s = float(saved.get("historySeconds", 0.0))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if not windows:
        return None
    return ErrorBudget.seeded(objective, windows, history_s, now_t - max(0.0, now_wall - as_of))


SERVED = "specfleet:requests_slo_served"
MET = "specfleet:requests_slo_met"


@dataclass
class FleetCounts:
    """The fleet's cumulative (met, served) counts, folded from per-pod counters that restart at zero.

    Each pod's counters are cumulative only for the life of its process: the fleet total grows by each
    pod's delta since its previous scrape, and a value below the previous one is a restart (the delta is
    the new value: what the new process has counted). A pod seen for the first time contributes nothing
    until its second scrape, so an operator restart does not count a pod's whole history as new."""

    good: float = 0.0
    total: float = 0.0
    last: dict[str, tuple[float, float]] = field(default_factory=dict)

    def fold(self, per_pod: dict[str, tuple[float, float]], present: set[str] | None = None) -> None:
        """`per_pod`: pod -> (met, served) as scraped now; pods in neither it nor `present` (the pods that
        still exist; a scrape can fail for one round) are forgotten."""
        for pod, (met, served) in per_pod.items():
            before = self.last.get(pod)
            if before is not None:
                self.good += _delta(before[0], met)
                self.total += _delta(before[1], served)
            self.last[pod] = (met, served)
        keep = set(per_pod) | (present or set())
        self.last = {pod: v for pod, v in self.last.items() if pod in keep}


def _delta(before: float, now: float) -> float:
    return now if now < before else now - before
