"""The simulator models the n-gram draft share: only a share of the decoding sequence-steps draft, the
step prices the tokens they compute, the engine's counters say so, and the trace replay takes the share
of each workload from the profile."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from specfleet.engine import profile_model as P
from specfleet.operator import cost
from specfleet.operator.catalogs import NO_PROFILES
from specfleet.operator.control.window import build_window
from specfleet.sim import fleet as F, replay, run, truth as T
from specfleet.sim.trace import Phase, Trace

ROOT = Path(__file__).resolve().parents[2]
CPU_SPEC = yaml.safe_load((ROOT / "manifests/examples/smollm2-cpu.yaml").read_text())["spec"]
ALPHA, K = 0.6, 4


def profile(copy_steps: int | None = 500, open_steps: int | None = 1250) -> P.Profile:
    """A SmolLM2-on-CPU-like profile whose n-gram measurements drafted 1000 tokens at k = 4 over
    `copy_steps` / `open_steps` decoding sequence-steps (shares 0.5 and 0.2; None: not measured)."""
    fit = {"decode": P.StepFit(0.08, 0.004, 0.0, 0.0, 4), "verify": P.StepFit(0.16, 0.004, 0.0, 0.0, 4),
           "prefill": P.StepFit(0.05, 0.0025, 0.0, 0.0, 4)}
    acceptance = [P.Acceptance("copy-heavy", K, 1000, 550, 250, copy_steps),
                  P.Acceptance("open-ended", K, 1000, 300, 250, open_steps)]
    return P.Profile("smollm2-135m", "cpu", "float32", {}, "", "test", [], fit, acceptance)


def _fleet(k: int = K, sequences: int = 10) -> F.SimulatedFleet:
    """One ready pod at depth `k` (0: off) with `sequences` past prefill that will not finish."""
    spec, plan, model, truth = run.setup_spec(replay.service_spec(CPU_SPEC, "on"), profile(), NO_PROFILES)
    fleet = F.SimulatedFleet(model, truth, spec.slo.prompt_tokens, 0.0, 1, 10_000, np.random.default_rng(0))
    fleet.set_speculation(k > 0, max(k, 1))
    fleet.add_pods(1, 0.0, k, ready_now=True)
    n = sequences
    fleet.req = {"rep": np.zeros(n), "start": np.zeros(n), "arrival": np.zeros(n), "pleft": np.zeros(n),
                 "oleft": np.full(n, 1e6), "first": np.zeros(n), "worst": np.zeros(n), "olen": np.full(n, 1e6),
                 "aligned": np.zeros(n)}
    return fleet


def _run(fleet: F.SimulatedFleet, share: float, t0: float = 0.0, seconds: float = 2.0, dt: float = 0.1) -> float:
    for i in range(round(seconds / dt)):
        fleet.tick(t0 + i * dt, dt, 0.0, ALPHA, share)
    return t0 + seconds


def _per_step(fleet: F.SimulatedFleet) -> tuple[float, float]:
    """(tokens per sequence-step, seconds per step) of pod 0 so far."""
    tokens = 1e6 - fleet.req["oleft"][0]
    steps = fleet.batch_steps[0]
    return tokens / steps, float(fleet.step_s[0].sum() / fleet.step_n[0].sum())


def expected_step(batch: int, share: float, k: int) -> float:
    """The test profile's speculative step: a verify step (a = 0.16) when any of the `batch` sequences
    drafts, else a decode step (a = 0.08); 0.004 s per token computed either way."""
    verifying = 1 - (1 - share) ** batch
    return verifying * 0.16 + (1 - verifying) * 0.08 + 0.004 * batch * (1 + share * k)


def test_a_share_of_drafting_sequences_yields_fewer_tokens_per_step_at_a_cheaper_step():
    half, full = _fleet(), _fleet()
    _run(half, 0.5)
    _run(full, 1.0)
    (tokens_half, step_half), (tokens_full, step_full) = _per_step(half), _per_step(full)
    assert tokens_half == pytest.approx(cost.expected_tokens(ALPHA, K, 0.5), rel=1e-6)
    assert tokens_full == pytest.approx(cost.expected_tokens(ALPHA, K), rel=1e-6)
    assert tokens_half < tokens_full
    assert step_half == pytest.approx(expected_step(10, 0.5, K))     # 1 + share x k tokens per sequence
    assert step_half < step_full == pytest.approx(0.16 + 0.004 * 10 * (1 + K))


def test_the_step_is_priced_at_the_drafted_tokens_per_sequence():
    truth = T.ProfileTruth(profile(), ctx=300, chunk=64)
    steps = truth.step(np.array([4, 4, 4]), np.array([0, 4, 4]), np.array([False, False, False]),
                       np.array([0.5, 0.5, 0.25]))
    assert steps.tolist() == pytest.approx([0.08 + 0.004 * 4, expected_step(4, 0.5, 4), expected_step(4, 0.25, 4)])
    assert expected_step(4, 0.25, 4) < 0.16 + 0.004 * 8          # a step without drafts is a decode step
    assert truth.step(np.array([4]), np.array([4]), np.array([False]))[0] == pytest.approx(0.16 + 0.004 * 20)


def test_the_prompt_budget_is_what_the_drafting_share_leaves():
    fleet = _fleet()
    batch, k = np.array([10.0]), np.array([K])
    assert fleet._room(batch, k, 0.5)[0] == max(fleet.m.chunk - 10 * (1 + 0.5 * K), 1.0)
    assert fleet._room(batch, k)[0] == max(fleet.m.chunk - 10 * (1 + K), 1.0)


def test_the_scraped_counters_give_the_draft_share_while_on_and_off():
    fleet = _fleet()
    prev = fleet.scrape(0.0)
    t = _run(fleet, 0.5)
    cur = fleet.scrape(t)
    on = build_window(prev, cur, expected=1)
    assert on.draft_share == pytest.approx(0.5) and on.draft_shares == pytest.approx((0.5,) * 4)
    assert on.acceptance_rate == pytest.approx((cost.expected_tokens(ALPHA, K) - 1) / K)
    assert on.mean_accepted_length == pytest.approx(cost.expected_tokens(ALPHA, K))   # per draft, not per step
    fleet.set_speculation(False, K)
    t2 = _run(fleet, 0.5, t)
    off = build_window(cur, fleet.scrape(t2), expected=1)
    per_token = tuple(cost.share_per_token(0.5, ALPHA, depth) for depth in range(1, 5))   # off: after every token
    assert off.draft_shares == pytest.approx(per_token) and off.draft_share is None
    assert off.counterfactual_acceptance_rate == pytest.approx(on.acceptance_rate)


SHARES = (0.6, 0.5, 0.4, 0.3)      # proposals often shorter than k: the share falls with the depth


def test_shares_by_depth_price_each_pod_at_its_own_depth_and_read_back_the_same_off():
    fleet = _fleet(k=2)
    prev = fleet.scrape(0.0)
    t = _run(fleet, SHARES)
    cur = fleet.scrape(t)
    on = build_window(prev, cur, expected=1)
    assert on.draft_share == pytest.approx(0.5)                   # drafted at k = 2
    assert on.draft_shares == pytest.approx(SHARES)
    tokens, step = _per_step(fleet)
    assert tokens == pytest.approx(cost.expected_tokens(ALPHA, 2, 0.5), rel=1e-6)
    assert step == pytest.approx(expected_step(10, 0.5, 2))
    fleet.set_speculation(False, 2)
    off = build_window(cur, fleet.scrape(_run(fleet, SHARES, t)), expected=1)
    assert off.draft_share is None
    assert [cost.share_per_step(x, ALPHA, j) for j, x in enumerate(off.draft_shares, 1)] == pytest.approx(SHARES)


def test_every_sequence_step_drafts_at_share_one():
    fleet = _fleet()
    prev = fleet.scrape(0.0)
    t = _run(fleet, 1.0)
    assert build_window(prev, fleet.scrape(t), expected=1).draft_share == pytest.approx(1.0)


def test_the_share_comes_from_the_profiles_workload_and_defaults_to_one():
    p = profile()
    assert T.acceptance_share(p, "copy-heavy", K) == pytest.approx(0.5)
    assert T.acceptance_share(p, "open-ended") == pytest.approx(0.2)
    assert T.acceptance_share(profile(None, None), "copy-heavy", K) == 1.0
    with pytest.raises(KeyError, match="no acceptance for workload 'chat'"):
        T.acceptance_share(p, "chat")


def test_the_profile_gives_a_share_per_depth_where_it_measured_every_depth_from_one():
    base = profile()
    by_depth = [P.Acceptance("copy-heavy", k, 100 * k * share, 50, 100, 100) for k, share in enumerate(SHARES, 1)]
    p = P.Profile(base.model, base.device, base.dtype, {}, "", "test", [], base.fit, by_depth)
    assert T.acceptance_shares(p, "copy-heavy", 4) == pytest.approx(SHARES)
    assert T.acceptance_shares(p, "copy-heavy", 2) == pytest.approx(SHARES[:2])
    assert T.acceptance_shares(base, "copy-heavy", 4) == pytest.approx(0.5)      # k = 4 only: one share


TRACE = Trace(phases=(Phase("copy", "copy-heavy", 10.0, 2, 2), Phase("open", "open-ended", 10.0, 2, 2)),
              max_tokens=32)


def test_the_replay_hands_each_phases_profile_share_to_the_fleet(monkeypatch):
    seen: dict[float, float] = {}
    tick = F.SimulatedFleet.tick

    def spy(self, t0, dt, rate, alpha, share=1.0):
        seen[alpha] = share
        return tick(self, t0, dt, rate, alpha, share)

    monkeypatch.setattr(F.SimulatedFleet, "tick", spy)
    r = replay.replay(TRACE, CPU_SPEC, profile(), replay.ReplayConfig(mode="on"), NO_PROFILES)
    assert r["draft_share"] == pytest.approx({"copy-heavy": 0.5, "open-ended": 0.2})
    assert seen == pytest.approx({r["alpha"]["copy-heavy"]: 0.5, r["alpha"]["open-ended"]: 0.2})
    seen.clear()
    old = replay.replay(TRACE, CPU_SPEC, profile(None, None), replay.ReplayConfig(mode="on"), NO_PROFILES)
    assert old["draft_share"] == {"copy-heavy": 1.0, "open-ended": 1.0} and set(seen.values()) == {1.0}


def test_a_prefilling_pod_steps_at_the_tokens_it_holds_not_a_full_budget():
    truth = T.ProfileTruth(profile(), ctx=300, chunk=64)
    prefill = lambda tokens: 0.05 + 0.0025 * tokens                         # noqa: E731
    steps = truth.step(np.array([4, 4, 4]), np.array([0, 0, 0]), np.array([True, True, False]),
                       pending=np.array([10, 500, 10]))
    assert steps.tolist() == pytest.approx([max(0.08 + 0.004 * 4, prefill(14)), prefill(64), 0.08 + 0.004 * 4])
    assert truth.step(np.array([4]), np.array([0]), np.array([True]))[0] == pytest.approx(prefill(64))


def test_no_first_token_comes_sooner_than_one_step_after_the_request_reaches_its_pod():
    fleet = _fleet(k=0, sequences=0)
    fleet.prompt = 2                                  # a cached prompt: two tokens left to prefill
    fleet.submit(np.array([0.05]), np.array([50.0]))
    _run(fleet, 1.0, seconds=1.0, dt=0.01)
    step = fleet.truth.step(np.array([1]), np.array([0]), np.array([True]), pending=np.array([2]))[0]
    ttft = float(fleet.req["first"][0] - fleet.req["arrival"][0])
    assert step <= ttft <= 2 * step + 0.01            # the running step's rest, then its own


def test_a_request_sent_as_its_predecessor_ended_waits_out_the_whole_step_in_progress():
    ttft = {}
    for aligned in (False, True):
        fleet = _fleet(k=0, sequences=4)
        fleet.prompt = 2                              # a cached prompt: two tokens left to prefill
        fleet.submit(np.array([0.05]), np.array([50.0]), aligned=aligned)
        _run(fleet, 1.0, seconds=1.0, dt=0.01)
        ttft[aligned] = float(fleet.req["first"][-1] - fleet.req["arrival"][-1])
    step = fleet.truth.step(np.array([5]), np.array([0]), np.array([True]), pending=np.array([2]))[0]
    assert ttft[True] == pytest.approx(2 * step, abs=0.011)          # the running step, all of it, then its own
    assert step <= ttft[False] < 2 * step                            # a share of the running step


def test_the_wait_is_priced_at_the_step_without_the_prompt():
    fleet = _fleet(k=0, sequences=0)
    fleet.prompt = 2
    fleet.submit(np.array([0.0]), np.array([50.0]), aligned=True)
    fleet._admit(0.0)
    r = fleet.req
    first = fleet._prefill(r, r["rep"].astype(int), np.array([1.0]), np.array([5.0]), 0.0, 0.1,
                           step=np.array([0.2]), plain=np.array([0.1]))
    assert first[0] == pytest.approx(0.1 + 0.2)       # the plain step it waits out, then the step that prefills it


def test_the_replay_aligns_a_clients_next_request_to_a_step_end_not_its_first(monkeypatch):
    sent = []
    original = F.SimulatedFleet.submit

    def submit(self, arrivals, outputs, aligned=False):
        sent.append((float(arrivals[0]), np.broadcast_to(aligned, np.shape(arrivals)).tolist()))
        return original(self, arrivals, outputs, aligned)

    monkeypatch.setattr(F.SimulatedFleet, "submit", submit)
    trace = Trace((Phase("one", "copy-heavy", 20.0, 1, 1), Phase("three", "copy-heavy", 20.0, 3, 3)), max_tokens=16)
    replay.replay(trace, CPU_SPEC, profile(), replay.ReplayConfig(mode="off"), NO_PROFILES)
    assert sent[0] == (0.0, [False])                  # the first client's first request
    assert all(flags == [True] for t, flags in sent[1:] if t < 20.0 - 1e-9)
    joined = next(flags for t, flags in sent if t >= 20.0 - 1e-9)
    assert joined.count(False) == 2                   # two clients join at 20 s, at no step's end


def test_the_replay_prefills_only_what_the_prefix_cache_leaves():
    r = replay.replay(TRACE, CPU_SPEC, profile(), replay.ReplayConfig(
        mode="off", prompt_tokens={"copy-heavy": 132, "open-ended": 44}, prefix_hit={"copy-heavy": 128 / 132}),
        NO_PROFILES)
    assert r["prompt_tokens"] == {"copy-heavy": 4, "open-ended": 44}
