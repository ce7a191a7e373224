"""The speculation controller on crafted windows."""
from __future__ import annotations

from dataclasses import replace

from specfleet.operator import cost
from specfleet.operator.capacity import Load, costs_replicas
from specfleet.operator.control import speculation as s
from specfleet.operator.cost import alpha_from_acceptance

POLICY = s.SpeculationPolicy(mode="auto", max_k=4, min_acceptance=0.5, dwell_s=60, reprobe_s=300)
# Where drafts cost replicas on the fixture's service (prefill-bound: draft tokens to verify take prompt
# budget): an acceptance above this policy's floor at which every depth carries less than none.
COSTLY = 0.3
COSTLY_POLICY = replace(POLICY, min_acceptance=0.2)


def feed(model, windows, state, policy=POLICY, every=15.0):
    out = []
    for i, w in enumerate(windows):
        d, state = s.decide(w, model, policy, state, 1000.0 + i * every)
        out.append(d)
    return out, state


def threshold_model(model):
    """The service with a low verify roofline so maxBatchForSpeculation is a small batch."""
    slow = replace(model, cal=replace(model.cal, flops_eff=model.cal.flops_eff / 40))
    return slow


def band_edges(model, alpha: float, policy=POLICY) -> tuple[int, int]:
    """The batches where the priced speed-up leaves the dead band: (back on below, off above)."""
    band = s.speedup_band(model, policy)
    return model.max_batch_for_speculation(alpha, band), model.max_batch_for_speculation(alpha, -band)


def test_speculation_turns_off_past_the_batch_threshold_and_back_on_below_it_after_the_dwell(model, make_window):
    m = threshold_model(model)
    on_below, off_above = band_edges(m, alpha_from_acceptance(0.6, 4))
    assert 2 < on_below < off_above < 200
    small = make_window(rps=0.01, batch=on_below * 0.5, acceptance=0.6, counterfactual=0.6, k=4)
    big = make_window(rps=0.01, batch=off_above * 2.0, acceptance=0.6, counterfactual=0.6, k=4)
    state = s.SpeculationState(True, m.best_k(on_below * 0.5, alpha_from_acceptance(0.6, 4)), since=0.0)
    decisions, state = feed(m, [small, big], state)
    assert decisions[0].enabled and not decisions[1].enabled and decisions[1].reason == "BatchAboveThreshold"
    off_at = 1015.0
    # the batch shrinks at once, but the controller keeps speculation off for the dwell time
    decisions, state = feed(m, [small] * 6, state)
    times = [1000.0 + 15 * i for i in range(6)]
    first_on = next(t for t, d in zip(times, decisions) if d.enabled)
    assert first_on - off_at >= POLICY.dwell_s - 15 and decisions[0].reason == "Dwell"
    assert next(d for d in decisions if d.enabled).reason == "SpeculationPays"


def test_hysteresis_keeps_the_state_near_the_threshold(model, make_window):
    m = threshold_model(model)
    on_below, off_above = band_edges(m, alpha_from_acceptance(0.6, 4))

    def near(edge):
        return [make_window(rps=0.01, batch=edge * f, acceptance=0.6, counterfactual=0.6)
                for f in (1.05, 0.95, 1.1, 0.9)]
    on, _ = feed(m, near(off_above), s.SpeculationState(True, 2, since=0.0))
    off, _ = feed(m, near(on_below), s.SpeculationState(False, 2, since=0.0))
    assert all(d.enabled for d in on) and not any(d.enabled for d in off)


def test_the_dead_band_keeps_either_state_where_the_price_is_within_the_costs_error(model, make_window):
    """Past the plain break-even the speed-up runs a few percent under 1 for a long way (a CPU's flat
    curve): a batch hysteresis alone switches there on every few percent of the price, the band not."""
    m = threshold_model(model)
    alpha = alpha_from_acceptance(0.6, 4)
    band, plain = s.speedup_band(m, POLICY), m.max_batch_for_speculation(alpha)
    costs_a_little = next(b for b in range(plain + 1, 200) if b > plain * (1 + POLICY.batch_hysteresis))
    gains_a_little = next(b for b in range(plain, 0, -1) if b < plain * (1 - POLICY.batch_hysteresis))
    assert 1 - band < m.speedup(costs_a_little, alpha)[0] < 1 < m.speedup(gains_a_little, alpha)[0] < 1 + band
    no_band = replace(POLICY, speedup_band=0.0)
    for batch, enabled, held in ((costs_a_little, True, "WithinCostError"), (gains_a_little, False, "NotPaying")):
        window = make_window(rps=0.01, batch=batch, acceptance=0.6, counterfactual=0.6, k=4)
        (kept,), _ = feed(m, [window], s.SpeculationState(enabled, 1, since=0.0))
        (flipped,), _ = feed(m, [window], s.SpeculationState(enabled, 1, since=0.0), policy=no_band)
        assert kept.enabled is enabled and not kept.changed and kept.reason == held
        assert flipped.enabled is not enabled and flipped.changed
        assert f"edge x{1 - band if enabled else 1 + band:.2f}" in kept.message


def test_the_band_is_the_costs_own_error_within_bounds(model):
    def band(error, **policy):
        return s.speedup_band(replace(model, calibration=replace(model.calibration, fit_error=error)),
                              replace(POLICY, **policy))
    assert band(None) == s.DEFAULT_BAND and band(0.04) == 0.04
    assert band(0.001) == s.MIN_BAND and band(0.6) == s.MAX_BAND
    assert band(0.6, speedup_band=0.0) == 0.0


def test_low_acceptance_turns_speculation_off(model, make_window):
    d, _ = feed(model, [make_window(rps=4.0, batch=8, acceptance=0.1, k=4)], s.SpeculationState(True, 4, since=0.0))
    assert not d[0].enabled and d[0].reason == "LowAcceptance"


def test_counterfactual_acceptance_turns_it_back_on(model, make_window):
    w = make_window(rps=4.0, batch=8, acceptance=None, counterfactual=0.7, k=4)
    d, st = feed(model, [w], s.SpeculationState(False, 4, since=0.0))
    assert d[0].enabled and d[0].reason == "SpeculationPays" and st.k >= 1


def test_without_counterfactual_evidence_it_reprobes_after_a_while(model, make_window):
    w = make_window(rps=4.0, batch=8, acceptance=None, counterfactual=None)
    d, _ = feed(model, [w], s.SpeculationState(False, 4, since=900.0))
    assert not d[0].enabled and d[0].reason == "NoAcceptanceEvidence"
    d, st = feed(model, [w], s.SpeculationState(False, 4, since=0.0))
    assert d[0].enabled and d[0].reason == "Reprobe" and st.probing


def test_missing_batch_holds(model, make_window):
    w = replace(make_window(), batch_size_mean=None)
    d, st = feed(model, [w, None], s.SpeculationState(True, 4, since=0.0))
    assert all(x.enabled and not x.changed for x in d)


def test_mode_off_never_enables(model, make_window):
    d, _ = feed(model, [make_window(counterfactual=0.9)], s.SpeculationState(False, 4, since=0.0),
                policy=replace(POLICY, mode="off"))
    assert not d[0].enabled


def test_speculation_goes_off_when_it_costs_replicas_and_shallower_first(model, make_window):
    """Draft tokens to verify take prompt budget on this prefill-bound service: at a load the replicas
    it needs without speculation carry only without it, k steps down to what is free, else off."""
    u = POLICY.utilization
    off = model.replica_rps(u)
    a = alpha_from_acceptance(COSTLY, 4)
    assert all(model.replica_rps(u, a, k) < off for k in range(1, 5))                # drafts cost here
    between = 2 * (model.replica_rps(u, a, 4) + model.replica_rps(u, a, 1)) / 2     # k=1 fits, k=4 not
    d, st = feed(model, [make_window(rps=between, pods=2, batch=30, acceptance=COSTLY, k=4)],
                 s.SpeculationState(True, 4, since=0.0), COSTLY_POLICY)
    assert d[0].enabled and d[0].reason == "DepthRetuned" and 1 <= st.k < 4
    d, st = feed(model, [make_window(rps=2 * off, pods=2, batch=30, acceptance=COSTLY, k=st.k)],
                 replace(st, since=0.0), COSTLY_POLICY)
    assert not d[0].enabled and d[0].reason == "CostsReplicas" and "replicas" in d[0].message
    # Off, the counterfactual acceptance clears the floor but the load still needs every replica: it stays off.
    busy = make_window(rps=2 * off, pods=2, batch=30, acceptance=None, counterfactual=COSTLY, k=4)
    d, _ = feed(model, [busy], replace(st, since=0.0), COSTLY_POLICY)
    assert not d[0].enabled and d[0].reason == "CostsReplicas"


def test_a_declared_floor_makes_speculation_free(model, make_window):
    """With minReplicas above what the load needs, the spare capacity pays for the draft tokens."""
    off = model.replica_rps(POLICY.utilization)
    busy = make_window(rps=2 * off, pods=6, batch=30, acceptance=None, counterfactual=0.8, k=4)
    d, _ = feed(model, [busy], s.SpeculationState(False, 4, since=0.0), policy=replace(POLICY, min_replicas=6))
    assert d[0].enabled and d[0].reason == "SpeculationPays"


def test_a_surge_turns_costly_speculation_off_at_once_past_the_dwell(model, make_window):
    off = model.replica_rps(POLICY.utilization)
    surge = make_window(rps=3 * off, pods=2, batch=30, acceptance=0.6, k=4, seconds=5.0)
    d, st = s.on_surge(surge, model, POLICY, s.SpeculationState(True, 4, since=995.0), 1000.0)
    assert d is not None and not d.enabled and d.reason == "SurgeCostsReplicas" and not st.enabled
    calm = make_window(rps=1.0, pods=2, batch=4, acceptance=0.6, k=4, seconds=5.0)
    assert s.on_surge(calm, model, POLICY, s.SpeculationState(True, 4), 1000.0)[0] is None
    assert s.on_surge(surge, model, POLICY, s.SpeculationState(False, 4), 1000.0)[0] is None


def test_a_load_near_one_replica_fewer_does_not_switch_speculation_back_on(model, make_window):
    """Just above what 3 replicas carry without speculation, 4 are needed and would carry it with
    speculation too; but a small dip would make 3 enough without it (and too few with it), so off
    stays off instead of flapping with the replica count."""
    off = model.replica_rps(POLICY.utilization)
    edge = make_window(rps=3.02 * off, pods=4, batch=30, acceptance=None, counterfactual=COSTLY, k=4)
    d, _ = feed(model, [edge], s.SpeculationState(False, 4, since=0.0), COSTLY_POLICY)
    assert not d[0].enabled and d[0].reason == "CostsReplicas"


def test_a_fixed_fleet_whose_queue_drains_keeps_speculating_at_a_load_the_model_prices_above_it(model, make_window):
    """Closed-loop clients send faster when answers come faster: on a fixed fleet the load measured while
    speculating can exceed what the model says a replica carries while its queue keeps draining. Then the
    fleet carries it as it runs: no CostsReplicas (which, with the off-state load below the model's
    capacity, switched speculation on and off every dwell on real engines). A queue that stands through
    the window longer than half the TTFT target still counts."""
    fixed = replace(COSTLY_POLICY, fixed_replicas=True)
    a = alpha_from_acceptance(COSTLY, 1)
    assert model.replica_rps(fixed.utilization, a, 1) < model.replica_rps(fixed.utilization)    # drafts cost here
    over = 3 * model.replica_rps(fixed.utilization)
    quick = 0.4 * model.ttft_s * over            # waits 0.4 x the TTFT target at the admitted rate
    slow = 0.6 * model.ttft_s * over
    for queue, growth, on in [(0.0, 0.0, True), (quick, 0.0, True), (slow, 0.0, False),
                              (0.0, -slow / 15, True),           # it stood at the start only: drained
                              (slow + quick, quick / 15, False)]:
        window = make_window(rps=over, pods=1, batch=20, acceptance=COSTLY, k=1, queue=queue, growth=growth)
        d, _ = feed(model, [window], s.SpeculationState(True, 1, since=0.0), policy=fixed)
        assert d[0].enabled == on and (on or d[0].reason == "CostsReplicas"), (queue, growth, d[0])
    autoscaled = make_window(rps=over, pods=1, batch=20, acceptance=COSTLY, k=1, queue=0.0, growth=0.0)
    d, _ = feed(model, [autoscaled], s.SpeculationState(True, 1, since=0.0), COSTLY_POLICY)
    assert not d[0].enabled and d[0].reason == "CostsReplicas"       # the autoscaler sizes by the model


def test_acceptance_just_below_the_floor_turns_speculation_off_only_on_enough_drafts(model, make_window):
    """0.15 accepted per drafted token at k=4 is below minAcceptanceRate; on 40 drafts (a 2 s window at
    the end of a ramp) that is within two standard errors of the floor, on 4,000 it is not."""
    low = make_window(rps=4.0, batch=8, acceptance=0.15, k=4)
    assert alpha_from_acceptance(0.15, 4) < POLICY.min_acceptance - POLICY.acceptance_hysteresis
    d, _ = feed(model, [replace(low, drafts=40.0)], s.SpeculationState(True, 4, since=0.0))
    assert d[0].enabled
    d, _ = feed(model, [replace(low, drafts=4000.0)], s.SpeculationState(True, 4, since=0.0))
    assert not d[0].enabled and d[0].reason == "LowAcceptance"


def test_low_acceptance_is_judged_on_the_first_draft_token_where_the_engines_count_it(model, make_window):
    """n-gram acceptance falls with the position: 0.15 of 4 drafted tokens reads as a per-token 0.38 under
    the geometric model, below the floor, while the first token may be accepted 0.8 of the time."""
    low = replace(make_window(rps=4.0, batch=8, acceptance=0.15, k=4), drafts=4000.0)
    assert alpha_from_acceptance(0.15, 4) < POLICY.min_acceptance - POLICY.acceptance_hysteresis
    d, _ = feed(model, [low], s.SpeculationState(True, 4, since=0.0))
    assert not d[0].enabled and d[0].reason == "LowAcceptance"             # no per-position counts
    d, _ = feed(model, [replace(low, first_token_acceptance=0.8)], s.SpeculationState(True, 4, since=0.0))
    assert d[0].enabled and d[0].reason != "LowAcceptance"
    d, _ = feed(model, [replace(low, first_token_acceptance=0.2)], s.SpeculationState(True, 4, since=0.0))
    assert not d[0].enabled and d[0].reason == "LowAcceptance"


def test_a_decision_says_what_speculation_gains_at_the_batch_it_saw(model, make_window):
    m = threshold_model(model)
    alpha = alpha_from_acceptance(0.6, 4)
    _, off_above = band_edges(m, alpha)
    low, high = (make_window(rps=0.01, batch=b, acceptance=0.6, counterfactual=0.6, k=4) for b in (1, 2 * off_above))
    (paying, costly), _ = feed(m, [low, high], s.SpeculationState(True, 4, since=0.0))
    gain = lambda d: float(d.message.split("(x")[1].split(" ")[0])          # noqa: E731
    assert f"pays up to batch {off_above} at the dead band's edge x0.95 (x" in paying.message
    assert "draft share 1.00" in paying.message
    assert gain(paying) > 1.0 >= gain(costly) and costly.reason == "BatchAboveThreshold"
    assert gain(paying) == round(m.speedup(1, alpha)[0], 2)


def test_the_share_is_priced_at_each_depth_and_alike_on_and_off(model, make_window):
    """Proposals shorter than k: the share falls with the depth. The engines count it the same way on
    and off, so at the same batch and acceptance the threshold is the same in both states (the old
    off-state proxy, steps with a guess standing, priced a share twice the one seen once on)."""
    m = threshold_model(model)
    shares = (0.45, 0.33, 0.27, 0.23)
    window = replace(make_window(rps=0.01, batch=2, acceptance=0.6, counterfactual=0.6, k=1), draft_shares=shares)
    no_band = replace(POLICY, speedup_band=0.0)         # one threshold for both states
    (on,), _ = feed(m, [window], s.SpeculationState(True, 1, since=0.0), policy=no_band)
    # Off, the engines propose after every token: the same text reads a larger share per token.
    per_token = tuple(cost.share_per_token(x, on.alpha, k) for k, x in enumerate(shares, start=1))
    assert all(t > x for t, x in zip(per_token, shares))
    (off,), _ = feed(m, [replace(window, draft_shares=per_token)], s.SpeculationState(False, 1, since=0.0),
                     policy=no_band)
    assert on.threshold == off.threshold == m.with_draft_share(shares).max_batch_for_speculation(on.alpha)
    gain, k = m.with_draft_share(shares).speedup(2, on.alpha)
    assert f"at k={k}, draft share {shares[k - 1]:.2f})" in on.message
    flat = m.with_draft_share(shares[0])       # one share for every depth overprices the deep ones
    assert flat.speedup(2, on.alpha)[0] > gain


class _Tie:
    """A service model whose replica carries `on` req/s speculating and 10 without."""

    ttft_s = 1.0

    def __init__(self, on: float):
        self.on = on

    def replica_rps(self, utilization, alpha=None, k=0):
        return self.on if k else 10.0


def test_turning_on_a_fixed_fleet_whose_queue_stands_wants_more_than_a_tie():
    """A capacity within the hysteresis of not speculating does not switch it on while the queue stands
    (a recalibration would flip it back); while on, a tie costs nothing; a drained queue needs no margin."""
    policy = replace(POLICY, fixed_replicas=True)
    standing = Load(rps=50.0, serving=4, backlog=40.0)        # waits 0.8 s, over half the TTFT target
    assert costs_replicas(_Tie(10.02), policy, standing, 0.6, 1, margin=0.15)
    assert not costs_replicas(_Tie(10.02), policy, standing, 0.6, 1)
    assert not costs_replicas(_Tie(12.0), policy, standing, 0.6, 1, margin=0.15)
    assert not costs_replicas(_Tie(10.02), policy, Load(rps=50.0, serving=4, backlog=1.0), 0.6, 1, margin=0.15)
