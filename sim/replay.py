"""Replay a closed-loop client trace (`trace.Trace`) on one simulated replica with the real controller.

The simulator's half of the sim-to-real comparison (`benchmarks/sim_to_real.py`): the same trace that
`benchmarks/closed_loop.py` runs on real engines under `specfleet up`. `trace.at(t)` active clients each
send their next request as soon as the last one ends (no think time), prompts of the phase's workload's
length (`ReplayConfig.prompt_tokens`, else the service's `promptTokens`), exactly the trace's
`max_tokens` out. The replica's step times come from the engine
profile (`truth.ProfileTruth`); the acceptance of each phase's workload is the profile's measured n-gram
acceptance for it at the replica's depth, and so is its draft share (the share of decoding sequence-steps
that draft: n-gram drafting finds a match only for some; 1.0 on a profile too old to have measured it).
`benchmarks/sim_to_real.py` puts in the acceptance of the closed loop's own prompts. With
`ReplayConfig.contention`, every step is that much longer at the clients in flight (`contention.Contention`,
measured by `benchmarks/contention.py`).
The controller is the operator's: one `control.coordinator.interval` per control interval (the
speculation controller with the replica count fixed at 1, as with `spec.replicas`) on windows built from the simulated engine's
metrics, and the calibration refitted online (`cost.calibration.recalibrate_from`) from its step-time
histograms. The plan and the controller's starting model are the operator's, as under `specfleet up`:
from the shipped measured profile where there is one, else the catalog's roofline.

Per phase (requests counted in the phase they finish in, as the real benchmark does): output tokens/s,
goodput (tokens/s of requests whose TTFT and mean time per output token meet the targets), TTFT and
ITL p50/p99, mean batch (step-weighted, as the engine's batch-size metric), the share of time
speculation was on, and every switch with its time, direction and reason.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specfleet.engine.profile_model import Profile
from specfleet.operator import api
from specfleet.operator.capacity import ServiceModel
from specfleet.operator.catalogs import ProfileCatalog
from specfleet.operator.control import autoscaler, coordinator, speculation
from specfleet.operator.cost import recalibrate_from
from specfleet.operator.control.window import Histogram, build_window, quantile
from specfleet.sim.contention import Contention
from specfleet.sim.fleet import ITL_BUCKETS, Record, SimulatedFleet
from specfleet.sim.run import setup_spec
from specfleet.sim.trace import Trace
from specfleet.sim.truth import acceptance_alphas, acceptance_shares

MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class ReplayConfig:
    mode: str = "auto"                 # spec.speculation.mode: auto | on | off
    interval_s: float = 5.0            # control interval (closed_loop.py shortens it to 5 s too)
    dwell_s: float = 10.0              # speculation dwell (likewise)
    dt: float = 0.1
    seed: int = 0
    prompt_tokens: dict[str, int] | None = None   # per workload; None (or a workload not in it): promptTokens
    # Share of each workload's prompt tokens the engine's prefix cache serves (a workload's prompts that
    # repeat): only the rest is prefilled. None (or a workload not in it): none.
    prefix_hit: dict[str, float] | None = None
    # Slowdown of the replica's steps by the clients in flight (engine and clients sharing the machine's
    # cores, `benchmarks/contention.py`); None: the profile's own step times.
    contention: Contention | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.dt <= 0 or self.interval_s < self.dt:
            raise ValueError("dt must be > 0 and interval_s >= dt")


@dataclass
class _Tick:
    t: float
    phase: str
    clients: int
    speculating: bool
    batch_sum: float           # the pod's cumulative batch-size sum and step count (the engine's histogram)
    batch_steps: float


@dataclass
class _Controller:
    """The operator's per-service speculation control and online calibration, one replica fixed."""

    model: ServiceModel
    policy: speculation.SpeculationPolicy
    state: speculation.SpeculationState
    prev: dict
    switches: list[dict] = field(default_factory=list)

    def interval(self, fleet: SimulatedFleet, t: float, phase: str) -> None:
        cur = fleet.scrape(t)
        window, self.prev = build_window(self.prev, cur, expected=len(cur)), cur
        if window is not None and window.complete:
            self.model = recalibrate_from(self.model, window, self.state.k)
        decided, states = coordinator.interval(window, self.model, 1, 1, None, self.policy,
                                               coordinator.Controllers(autoscaler.AutoscalerState(), self.state), t,
                                               self.model.min_acceptance)
        decision, self.state = decided.speculation, states.speculation
        if decision.changed and decision.enabled != bool(fleet.k[0] > 0):
            self.switches.append({"t": round(t, 2), "phase": phase, "direction": "on" if decision.enabled else "off",
                                  "k": decision.k, "reason": decision.reason,
                                  "batch": _round(window.batch_size_mean if window else None),
                                  "threshold": decision.threshold, "message": decision.message})
        fleet.set_speculation(decision.enabled, decision.k)


def service_spec(cr_spec: dict, mode: str) -> api.InferenceServiceSpec:
    """The CR's spec with `speculation.mode` set."""
    return api.parse_spec({**cr_spec, "speculation": {**cr_spec.get("speculation", {}), "mode": mode}})


def _prefilled(prompt: int, hit: float) -> int:
    """Prompt tokens a request prefills when the prefix cache serves a `hit` share of its `prompt`."""
    return max(1, round(prompt * (1.0 - hit)))


def replay(trace: Trace, cr_spec: dict, profile: Profile, cfg: ReplayConfig = ReplayConfig(),
           planned: ProfileCatalog | None = None) -> dict:
    """Run `trace` on one replica of the service `cr_spec` (a CR's `spec`) with `profile` as the truth;
    the operator plans with the profile catalogue `planned` (None: the shipped one, as `specfleet up`)."""
    spec, plan, model, truth = setup_spec(service_spec(cr_spec, cfg.mode), profile, planned)
    k_max = spec.speculation.max_speculative_tokens
    alphas = {p.workload: acceptance_alphas(profile, p.workload, k_max) for p in trace.phases}
    shares = {p.workload: acceptance_shares(profile, p.workload, k_max) for p in trace.phases}
    prompts = {p.workload: _prefilled((cfg.prompt_tokens or {}).get(p.workload, spec.slo.prompt_tokens),
                                      (cfg.prefix_hit or {}).get(p.workload, 0.0)) for p in trace.phases}
    fleet = SimulatedFleet(model, truth, prompts[trace.phases[0].workload], 0.0, plan.gpus_per_replica,
                           plan.kv_cache_blocks * plan.block_size, np.random.default_rng(cfg.seed), "deadline",
                           contention=cfg.contention)
    fleet.record = Record()
    # The engine starts as the plan renders it (its enabled flag and depth), as under `specfleet up`.
    state = speculation.SpeculationState(plan.speculation.enabled and cfg.mode != "off", max(1, plan.speculation.k))
    fleet.set_speculation(state.enabled, state.k)
    fleet.add_pods(1, 0.0, state.k if state.enabled else 0, ready_now=True)
    # As control/loop.py builds it for a CR with `spec.replicas` and SPECFLEET_SPECULATION_DWELL set.
    policy = speculation.SpeculationPolicy.from_spec(spec.speculation, spec.runtime.engine, spec.autoscaling,
                                                     fixed_replicas=True, dwell_s=cfg.dwell_s)
    ctl = _Controller(model, policy, state, fleet.scrape(0.0))
    ticks = [_Tick(0.0, trace.phases[0].name, 0, state.enabled, 0.0, 0.0)]
    t, next_control, before = 0.0, cfg.interval_s, 0
    while t < trace.duration - 1e-9:
        phase, clients = trace.at(t)
        missing = clients - fleet.in_flight()          # each client sends its next request as its last ends
        fleet.prompt = prompts[phase.workload]
        if missing > 0:
            joining = min(missing, max(clients - before, 0))     # their first request: at no step's end
            fleet.submit(np.full(missing, t), np.full(missing, float(trace.max_tokens)),
                         aligned=np.arange(missing) >= joining)
        before = clients
        fleet.tick(t, cfg.dt, 0.0, alphas[phase.workload], shares[phase.workload])
        t += cfg.dt
        ticks.append(_Tick(t, phase.name, clients, bool(fleet.k[0] > 0), float(fleet.batch_sum[0]),
                           float(fleet.batch_steps[0])))
        if t + 1e-9 >= next_control:
            next_control += cfg.interval_s
            ctl.interval(fleet, t, phase.name)
    m = ctl.model
    extra = {} if cfg.contention is None else {"contention": cfg.contention.source or "given"}
    return {**extra, "mode": cfg.mode, "seed": cfg.seed, "truth": truth.source,
            "truth_fit_error": {kind: round(f.rel_rms_error, 3) for kind, f in profile.fit.items()},
            "truth_notes": truth.notes,
            "prompt_tokens": prompts, "max_tokens": trace.max_tokens, "interval_s": cfg.interval_s,
            "dwell_s": cfg.dwell_s, "max_num_seqs": m.max_num_seqs, "token_budget": m.chunk, "alpha": alphas,
            "draft_share": shares,
            "phases": {name: _phase(fleet.record, ticks, m, start, end) for name, start, end in trace.bounds()},
            "switches": ctl.switches,
            "calibration": {"bw_eff": m.cal.bw_eff, "flops_eff": m.cal.flops_eff, "t_fixed": m.cal.t_fixed},
            "series": [{"t": round(x.t, 2), "phase": x.phase, "clients": x.clients, "speculating": x.speculating}
                       for x in ticks[::max(1, round(1.0 / cfg.dt))]]}


def _phase(record: Record, ticks: list[_Tick], model: ServiceModel, start: float, end: float) -> dict:
    seconds = end - start
    inside = [(itl, toks) for t, itl, toks in record.intervals if start < t <= end + 1e-9]
    itl = np.concatenate([x for x, _ in inside]) if inside else np.zeros(0)      # each token's interval
    toks = np.concatenate([y for _, y in inside]) if inside else np.zeros(0)     # tokens at that interval
    done = [f for f in record.finished if start < f[0] <= end + 1e-9]
    ttft = np.concatenate([f[1] for f in done]) if done else np.zeros(0)
    decode = np.concatenate([f[2] for f in done]) if done else np.zeros(0)
    out = np.concatenate([f[3] for f in done]) if done else np.zeros(0)
    met = (ttft <= model.ttft_s) & (decode <= model.itl_s)
    marks = [x for x in ticks if start - 1e-9 <= x.t <= end + 1e-9]
    steps = marks[-1].batch_steps - marks[0].batch_steps if len(marks) > 1 else 0.0
    share = [x.speculating for x in ticks if start < x.t <= end + 1e-9]
    return {"seconds": seconds, "requests": int(len(out)),
            "throughput_tok_s": round(float(out.sum()) / seconds, 2),
            "goodput_tok_s": round(float(out[met].sum()) / seconds, 2),
            "ttft_p50_ms": _ms(_quantile(ttft, None, 0.5)), "ttft_p99_ms": _ms(_quantile(ttft, None, 0.99)),
            "itl_p50_ms": _ms(_bucketed_quantile(itl, toks, 0.5)),
            "itl_p99_ms": _ms(_bucketed_quantile(itl, toks, 0.99)),
            "batch_mean": round((marks[-1].batch_sum - marks[0].batch_sum) / steps, 2) if steps else None,
            "speculation_on_share": round(sum(share) / len(share), 3) if share else None}


def _quantile(values: np.ndarray, weights: np.ndarray | None, q: float) -> float | None:
    """The q-quantile of `values`, each counted `weights` times (None: once)."""
    if not len(values):
        return None
    w = np.ones(len(values)) if weights is None else np.asarray(weights, float)
    if w.sum() <= 0:
        return None
    order = np.argsort(values)
    cum = np.cumsum(w[order])
    return float(values[order][np.searchsorted(cum, q * cum[-1])])


def _bucketed_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float | None:
    """The q-quantile as the real side reads the engine's ITL: `values` (each counted `weights` times)
    binned into the engine's buckets, then interpolated within one as `histogram_quantile` does. Exact
    quantiles of a distribution with two modes (a speculative step's tokens one and two at a time) land
    elsewhere in a 50 ms bucket than the interpolation does."""
    if not len(values) or np.sum(weights) <= 0:
        return None
    counts = np.bincount(np.searchsorted(ITL_BUCKETS, values), weights=weights, minlength=len(ITL_BUCKETS))
    return quantile(Histogram(ITL_BUCKETS, tuple(np.cumsum(counts).tolist())), q)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), 2)
