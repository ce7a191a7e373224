"""The GPU pricing of speculation against published speed-up-versus-batch measurements.

Each series of tests/data/published_speculation.yaml says, per pricing (the operator's roofline; its
former pricing, docs/speculation-gpu.md), whether its break-even batch falls in the published range. An
entry marked as agreeing must agree; one marked as differing, with its reason, must still differ, so
that a pricing change that fixes (or breaks) an entry fails here until the data file says so.
"""
from __future__ import annotations

import math

import pytest

from published_pricing import DATA, PRICINGS, load, priced_break_even, published_break_even, within

SERIES, RAW = load()
CASES = [pytest.param(s, p, id=f"{s.id}-{p}") for s in SERIES for p in PRICINGS]


@pytest.mark.parametrize("series", SERIES, ids=lambda s: s.id)
def test_published_break_even_is_read_off_the_published_speedups(series):
    assert len(series.batches) == len(series.speedups) and list(series.batches) == sorted(series.batches)
    assert series.break_even == published_break_even(series.batches, series.speedups)
    assert len(series.ks) in (1, len(series.batches))


@pytest.mark.parametrize("series, pricing", CASES)
def test_priced_break_even_agrees_with_the_published_range_as_the_data_file_says(series, pricing):
    verdict = series.agrees[pricing]
    priced = priced_break_even(series, pricing)
    lo, hi = series.break_even
    shown = f"priced break-even {priced:.1f}, published [{lo}, {'-' if hi is None else hi}]"
    if verdict["value"]:
        assert within(priced, series.break_even), shown
    else:
        assert verdict.get("reason", "").strip(), f"{series.id}: a differing entry needs its reason"
        assert not within(priced, series.break_even), f"{shown}: now agrees; update {DATA.name}"


def test_every_source_and_acceptance_is_cited():
    for entry in RAW["series"]:
        assert entry["source"] and entry["how"] in ("quoted table", "read off a plot (approximate)")
    for acceptance in RAW["acceptance"].values():
        assert 0 < acceptance["alpha"] < 1 and acceptance["source"] and acceptance["read"]
    assert all(u["why"] for u in RAW["unpriced"])


def test_the_roofline_agrees_wherever_its_former_pricing_did():
    """The change to the roofline was only worth making if it lost no published range the former pricing kept."""
    lost = [s.id for s in SERIES if s.agrees["former"]["value"] and not s.agrees["roofline"]["value"]]
    assert not lost


def test_break_even_search_sees_a_curve_that_pays_throughout_or_never():
    from published_pricing import break_even

    assert break_even(lambda b: 2.0) == math.inf
    assert break_even(lambda b: 0.5) == 0.0
    assert break_even(lambda b: 2.0 - b / 20) == pytest.approx(20, abs=0.02)
    assert break_even(lambda b: 0.6 + b / 64, start=32) == math.inf   # below 1 under 26: not measured
