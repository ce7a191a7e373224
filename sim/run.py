"""One simulation: a scenario, a policy, a seed -> the summary and a time series."""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from specfleet.engine.profile_model import Profile
from specfleet.operator import catalogs, planner
from specfleet.operator.catalogs import normalize
from specfleet.operator.control import autoscaler, coordinator, speculation
from specfleet.operator.capacity import ServiceModel, service_model
from specfleet.operator.cost import recalibrate_from
from specfleet.operator.control.window import build_window
from specfleet.sim import policies as P
from specfleet.sim.fleet import SimulatedFleet
from specfleet.sim.scenarios import Scenario
from specfleet.sim.truth import ProfileTruth, find_profile, truth_for

INTERVAL_S = 15.0
DT = 0.5


def setup(scenario: Scenario, profile: Profile | Path | None = None):
    """(spec, plan, model, truth) of a scenario's service. The plan and the controller's model are what
    the operator makes of the spec (`catalogs.profiles()` as in reconcile.py: the measured profile where
    one is shipped, else the catalog's roofline); the fleet's truth is the engine profile of its (model,
    accelerator), `profile` when given. The controller learns the difference online."""
    return setup_spec(scenario.spec, profile)


def setup_spec(spec, profile: Profile | Path | None = None, planned: catalogs.ProfileCatalog | None = None):
    """As `setup`; `planned` is the profile catalogue the operator plans with (None: the shipped one)."""
    plan = planner.plan(spec, catalogs.gpus(), catalogs.models(), catalogs.profiles() if planned is None else planned)
    if isinstance(plan, planner.Infeasible):
        raise ValueError(f"the service is infeasible: {plan.message}")
    model = service_model(spec, plan, catalogs.gpus(), catalogs.models())
    return spec, plan, model, service_truth(spec, plan.accelerator, model, profile)


def service_truth(spec, accelerator: str, model: ServiceModel, profile: Profile | Path | None) -> ProfileTruth:
    """The profile of the service's model (by its name, else its source's) on `accelerator`."""
    if profile is None:
        names = (spec.model.name, normalize(spec.model.source).rsplit("/", 1)[-1].split(":", 1)[-1])
        profile = next((p for n in names if (p := find_profile(n, accelerator)) is not None), None)
    return truth_for(spec.model.name, accelerator, model.ctx, model.chunk, profile)


def make_policies(name: str, scenario: Scenario, spec, model: ServiceModel, truth, fixed: int | None,
                  knobs: dict | None = None):
    """(scaler, speculation controller) for a policy name; `knobs` override a peer baseline's settings
    (`policies.KNOBS`: inflight-target's `target_fraction` of maxNumSeqs, saturation's `kv_target` and
    `queue_target`, ...)."""
    auto, sp = spec.autoscaling, spec.speculation
    knobs = dict(knobs or {})
    unknown = set(knobs) - set(P.KNOBS.get(name, ()))
    if unknown:
        raise ValueError(f"policy {name!r} has no knob {', '.join(sorted(unknown))}; "
                         f"it takes {', '.join(P.KNOBS.get(name, ())) or 'none'}")
    policy = speculation.SpeculationPolicy.from_spec(sp, autoscaling=auto, fixed_replicas=fixed is not None)
    ours_spec = P.SpecfleetSpeculation(policy, speculation.SpeculationState(True, sp.max_speculative_tokens))
    # Static peak provisioning, and a peer told so, run without speculative decoding (vLLM's default).
    if not knobs.pop("speculate", 1) or (name == "static-peak" and fixed is None):
        ours_spec = P.FixedSpeculation(False, sp.max_speculative_tokens, "spec-always-off")
    true_cal = truth.calibration(model.shape, model.prior)
    true_model = replace(model, cal=true_cal, prior=true_cal)
    alpha0 = scenario.alpha(0)
    k_peak = true_model.best_k(true_model.slo_batch(), alpha0)
    # Static peak provisioning sizes replicas as ours do (the same capacity at the same utilization,
    # with speculation where it carries more, else without), for the peak load, and never scales.
    sizing = autoscaler.ScalingPolicy().target_utilization
    per = max(true_model.replica_rps(sizing), true_model.replica_rps(sizing, alpha0, k_peak))
    peak = math.ceil(scenario.peak_rate() / per)
    if fixed is not None:
        scaler = P.StaticScaler(fixed, name="fixed")
    elif name in ("specfleet",) + P.SPECULATION:
        scaler = P.SpecfleetScaler(autoscaler.ScalingPolicy.from_spec(auto))
    elif name == "static-peak":
        scaler = P.StaticScaler(min(max(peak, auto.min_replicas), auto.max_replicas))
    elif name == "inflight-target":
        scaler = P.InflightScaler.of_fraction(model.max_num_seqs, auto.min_replicas, auto.max_replicas, **knobs)
    elif name == "saturation":
        scaler = P.SaturationScaler(auto.min_replicas, auto.max_replicas, **knobs)
    else:
        raise KeyError(f"unknown policy {name!r}; one of {', '.join(P.POLICIES)}")
    spec_ctl = {"spec-always-on": P.FixedSpeculation(True, sp.max_speculative_tokens, "spec-always-on"),
                "spec-always-off": P.FixedSpeculation(False, sp.max_speculative_tokens, "spec-always-off"),
                "spec-batch-table": P.BatchTableSpeculation(sp.max_speculative_tokens)}.get(name, ours_spec)
    return scaler, spec_ctl, peak


def queue_policy_of(policy: str) -> str:
    """The engine scheduler a policy runs on: ours (specfleet engines) order their waiting prompts by
    deadline; the peer baselines and static-peak run FIFO engines (vLLM's default)."""
    return "deadline" if policy in ("specfleet",) + P.SPECULATION else "fifo"


def simulate(scenario: Scenario, policy: str, seed: int = 0, fixed_replicas: int | None = None,
             interval_s: float = INTERVAL_S, dt: float = DT, queue_policy: str | None = None,
             knobs: dict | None = None, profile: Profile | Path | None = None) -> dict:
    """Run `policy` on `scenario`; `queue_policy` (fifo | deadline) overrides the policy's engine;
    `knobs` override a peer baseline's settings (see `make_policies`); `profile` is the fleet's truth
    (default: the shipped profile of the scenario's model and accelerator)."""
    spec, plan, model, truth = setup(scenario, profile)
    scaler, spec_ctl, peak = make_policies(policy, scenario, spec, model, truth, fixed_replicas, knobs)
    rng = np.random.default_rng(seed)
    queue_policy = queue_policy or queue_policy_of(policy)
    fleet = SimulatedFleet(model, truth, spec.slo.prompt_tokens, scenario.startup_s, plan.gpus_per_replica,
                  plan.kv_cache_blocks * plan.block_size, rng, queue_policy, scenario.output_sigma)
    enabled, k = _initial_speculation(spec_ctl, spec)
    fleet.set_speculation(enabled, k)
    start = _initial_replicas(scaler, scenario, model, spec)
    fleet.add_pods(start, 0.0, k if enabled else 0, ready_now=True)
    prev, series, actions, switches, spec_reason = fleet.scrape(0.0), [], 0, 0, ""
    # Surge detection between decisions (ours only): scrapes every `detect_s`, scale-ups only.
    detect_s = getattr(scaler, "detect_interval_s", 0.0)
    detect_s = detect_s if 0 < detect_s < interval_s else 0.0
    recent, next_detect = prev, detect_s or math.inf
    next_control, t = interval_s, 0.0
    while t < scenario.duration_s - 1e-9:
        fleet.tick(t, dt, scenario.rate(t + dt / 2), scenario.alpha(t + dt / 2))
        t += dt
        if t + 1e-9 < next_control:
            if t + 1e-9 >= next_detect:
                next_detect += detect_s
                cur = fleet.scrape(t)
                window, recent = build_window(recent, cur, expected=len(cur)), cur
                desired, reason, switched = scaler.detect(window, model, len(fleet.alive()), t, spec_ctl, enabled, k,
                                                          scenario.alpha(t), _ready(fleet, t))
                if switched is not None:        # a surge turned speculation off; it was sized without it
                    switches, (enabled, k, spec_reason) = switches + 1, switched
                    fleet.set_speculation(enabled, k)
                if _scale(fleet, desired, t, k if enabled else 0):
                    actions += 1
                    series.append(_point(t, scenario, fleet, window, model, enabled, k, reason, spec_reason))
            continue
        next_control += interval_s
        next_detect = t + detect_s if detect_s else math.inf
        cur = fleet.scrape(t)
        window = build_window(prev, cur, expected=len(cur))
        prev = recent = cur
        if window is not None and window.complete:
            model = recalibrate_from(model, window, k)
        # Ours judge speculation on the load our autoscaler sizes for (coordinator.interval's order).
        on, new_k, spec_reason = spec_ctl.decide(window, model, t, getattr(scaler, "headroom", lambda _w: 0.0)(window))
        if (on, new_k if on else 0) != (enabled, k if enabled else 0):
            switches += int(on != enabled)
            enabled, k = on, new_k
            fleet.set_speculation(enabled, k)
        desired, reason = scaler.decide(window, model, len(fleet.alive()), t,
                                        *_speculating(window, k, enabled, scenario, t), _ready(fleet, t))
        actions += _scale(fleet, desired, t, k if enabled else 0)
        series.append(_point(t, scenario, fleet, window, model, enabled, k, reason, spec_reason))
    out = _summary(scenario, policy, fleet, series, actions, switches, peak, model, seed)
    return {**out, "knobs": dict(knobs)} if knobs else out


def _speculating(window, k: int, enabled: bool, scenario: Scenario, t: float) -> tuple[float, int]:
    """(alpha, k) of the speculation in effect, as the scaler sees it (0, 0 while off)."""
    return (coordinator.alpha_in_effect(window, k, scenario.alpha(t)), k) if enabled else (0.0, 0)


def _ready(fleet: SimulatedFleet, t: float) -> int:
    return int(sum(1 for i in fleet.ready(t) if not fleet.draining[i]))


def _scale(fleet: SimulatedFleet, desired: int, t: float, k: int) -> int:
    """Apply a replica count; 1 when it changed the fleet."""
    current = len(fleet.alive())
    if desired > current:
        fleet.add_pods(desired - current, t, k)
    elif desired < current:
        fleet.remove_pods(current - desired, t)
    return int(desired != current)


def _initial_speculation(spec_ctl, spec) -> tuple[bool, int]:
    if isinstance(spec_ctl, P.FixedSpeculation):
        return spec_ctl.enabled, spec_ctl.k
    return True, spec.speculation.max_speculative_tokens


def _initial_replicas(scaler, scenario, model, spec) -> int:
    if isinstance(scaler, P.StaticScaler):
        return scaler.replicas
    alpha = scenario.alpha(0)
    per = model.replica_rps(autoscaler.ScalingPolicy().target_utilization, alpha,
                            model.best_k(model.slo_batch(), alpha))
    auto = spec.autoscaling
    return min(max(math.ceil(scenario.rate(0) / per), auto.min_replicas), auto.max_replicas)


def _point(t, scenario, fleet, window, model, enabled, k, reason, spec_reason) -> dict:
    ttft = window.ttft_p99 if window is not None else None
    itl = window.itl_p99 if window is not None else None
    return {"t": t, "rate": scenario.rate(t), "alpha": scenario.alpha(t), "replicas": len(fleet.alive()),
            "ready": _ready(fleet, t), "queue": fleet.queue_depth(),
            "batch": None if window is None else window.batch_size_mean,
            "ttft_p99_ms": None if ttft is None else round(ttft * 1000, 1),
            "itl_p99_ms": None if itl is None else round(itl * 1000, 2),
            "speculation": bool(enabled), "k": int(k if enabled else 0), "scale_reason": reason,
            "speculation_reason": spec_reason}


def _summary(scenario, policy, fleet, series, actions, switches, peak, model, seed) -> dict:
    tot = fleet.totals
    ttfts = np.concatenate(fleet.ttft_samples) if fleet.ttft_samples else np.zeros(1)
    stuck = fleet.unfinished_late(scenario.duration_s)
    requests = tot.requests + stuck
    return {"scenario": scenario.name, "policy": policy, "queue_policy": fleet.queue_policy, "seed": seed,
            "duration_s": scenario.duration_s,
            "requests": requests,
            "slo_attainment": round(tot.met / requests, 5) if requests else None,
            "goodput": round(tot.good_tokens / scenario.duration_s, 1),
            "throughput": round(tot.tokens / scenario.duration_s, 1),
            "gpu_hours": round(tot.gpu_seconds / 3600, 3),
            "goodput_per_gpu_hour": round(tot.good_tokens / max(tot.gpu_seconds / 3600, 1e-9), 1),
            "scaling_actions": actions, "speculation_switches": switches,
            "mean_tpot_ms": round(1000 * tot.tpot_sum / max(tot.requests, 1), 2),
            "ttft_p99_ms": round(float(np.quantile(ttfts, 0.99)) * 1000, 1),
            "max_replicas": max((p["replicas"] for p in series), default=0), "static_peak_replicas": peak,
            "calibration": {"bw_eff": model.cal.bw_eff, "flops_eff": model.cal.flops_eff,
                            "t_fixed": model.cal.t_fixed},
            "truth": fleet.truth.source, "truth_notes": fleet.truth.notes,
            "series": series}
