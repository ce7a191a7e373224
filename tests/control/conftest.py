"""Fixtures for the control loop's tests: the simulator's service model and a window builder."""
from __future__ import annotations

import math

import pytest

from specfleet.operator.control.window import Histogram, Window

TTFT_BOUNDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, math.inf)
ITL_BOUNDS = (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.05, math.inf)


@pytest.fixture(scope="session")
def service():
    from specfleet.sim import run, scenarios

    spec, plan, model, _truth = run.setup(scenarios.steady())
    return spec, plan, model


@pytest.fixture
def model(service):
    return service[2]


def _hist(bounds, value: float, count: float) -> Histogram:
    return Histogram(bounds, tuple(count if value <= b else 0.0 for b in bounds), value * count)


@pytest.fixture
def make_window():
    """A complete window (15 s unless `seconds`): `rps` first tokens/s, `queue` waiting, latencies in
    seconds; `finished` requests ended/s and `running_growth` only when given (else unknown)."""
    def make(rps: float = 20.0, queue: float = 0.0, growth: float = 0.0, pods: int = 2, scraped: int | None = None,
             ttft: float = 0.2, itl: float = 0.015, batch: float = 40.0, acceptance: float | None = 0.6,
             counterfactual: float | None = None, k: int = 4, end: float = 15.0, seconds: float = 15.0,
             finished: float | None = None, running_growth: float | None = None) -> Window:
        n = rps * seconds
        return Window(start=end - seconds, end=end, pods_expected=pods,
                      pods_scraped=pods if scraped is None else scraped, requests_per_second=rps,
                      finished_per_second=finished, queue_growth_per_second=growth,
                      running_growth_per_second=running_growth, ttft=_hist(TTFT_BOUNDS, ttft, n),
                      itl=_hist(ITL_BOUNDS, itl, n * 100), batch_size_mean=batch, running=batch * pods,
                      queue_depth=queue, kv_cache_usage=0.3, generation_tokens_per_second=rps * 300,
                      acceptance_rate=acceptance, counterfactual_acceptance_rate=counterfactual,
                      num_speculative_tokens=k)
    return make
