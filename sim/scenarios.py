"""Workload scenarios: arrival rate and acceptance over time, request sizes, the service under test."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from specfleet.operator import api

SERVICE = {"model": {"name": "llama-8b", "source": "hf://meta-llama/Llama-3.1-8B-Instruct"},
           "accelerator": {"type": "nvidia-h100-80gb"},
           "slo": {"ttftP99Ms": 1000, "itlP99Ms": 25, "maxContextTokens": 4096, "promptTokens": 1000,
                   "outputTokens": 300, "requestsPerSecond": 50},
           "speculation": {"mode": "auto", "method": "ngram", "maxSpeculativeTokens": 4, "minAcceptanceRate": 0.5},
           "autoscaling": {"minReplicas": 1, "maxReplicas": 40, "scaleUpStabilizationSeconds": 30,
                           "scaleDownStabilizationSeconds": 300}}


@dataclass(frozen=True)
class Scenario:
    name: str
    duration_s: float
    rate: Callable[[float], float]             # requests/s at time t
    alpha: Callable[[float], float]            # per-token draft acceptance probability at time t
    description: str
    service: dict = field(default_factory=lambda: SERVICE)
    startup_s: float = 30.0                    # pod creation -> ready (image cached, weights on local disk)
    output_sigma: float = 0.5                  # lognormal spread of output lengths around the SLO's mean

    @property
    def spec(self) -> api.InferenceServiceSpec:
        return api.parse_spec(self.service)

    def peak_rate(self, step: float = 5.0) -> float:
        return max(self.rate(i * step) for i in range(int(self.duration_s / step) + 1))


BASE_RPS = 60.0


def _const(value: float) -> Callable[[float], float]:
    return lambda _t: value


def steady(load: float = 1.0) -> Scenario:
    return Scenario("steady", 3600, _const(BASE_RPS * load), _const(0.6), f"constant {BASE_RPS * load:g} req/s")


def diurnal() -> Scenario:
    low, high, period = BASE_RPS * 0.5, BASE_RPS * 4, 7200.0

    def rate(t: float) -> float:
        return low + (high - low) * (1 - math.cos(2 * math.pi * t / period)) / 2
    return Scenario("diurnal", period, rate, _const(0.6), f"a day compressed into 2 h: {low:g} -> {high:g} req/s")


def flash_crowd(t: float, start: float, factor: float, ramp: float = 30.0, hold: float = 300.0,
                decay: float = 120.0) -> float:
    """Multiplier of a flash crowd: x`factor` reached within `ramp` s, held, then decaying."""
    if t < start:
        return 1.0
    if t < start + ramp:
        return 1 + (factor - 1) * (t - start) / ramp
    if t < start + ramp + hold:
        return factor
    if t < start + ramp + hold + decay:
        return factor - (factor - 1) * (t - start - ramp - hold) / decay
    return 1.0


def bursty() -> Scenario:
    base = BASE_RPS * 0.8

    def rate(t: float) -> float:
        return base * max(flash_crowd(t, 900, 5.0), flash_crowd(t, 2700, 5.0))
    return Scenario("bursty", 3600, rate, _const(0.6), f"{base:g} req/s with two flash crowds x5 in 30 s "
                    "(held 5 min)")


def acceptance_drift() -> Scenario:
    def alpha(t: float) -> float:
        return 0.8 if t < 1200 else (0.25 if t > 2400 else 0.8 - 0.55 * (t - 1200) / 1200)
    return Scenario("acceptance-drift", 3600, _const(BASE_RPS * 1.5), alpha,
                    "copy-heavy (acceptance 0.8) drifting to open-ended chat (0.25)")


SCENARIOS = {"steady": steady, "diurnal": diurnal, "bursty": bursty, "acceptance-drift": acceptance_drift}


def get(name: str) -> Scenario:
    if name not in SCENARIOS:
        raise KeyError(f"unknown scenario {name!r}; one of {', '.join(SCENARIOS)}")
    return SCENARIOS[name]()


def from_trace(path: Path, alpha: float = 0.6) -> Scenario:
    """A trace file: one arrival rate per line, `seconds rps` (piecewise constant), '#' comments."""
    points = []
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            t, r = line.replace(",", " ").split()[:2]
            points.append((float(t), float(r)))
    if not points:
        raise ValueError(f"{path}: no `seconds rps` lines")
    points.sort()

    def rate(t: float) -> float:
        current = points[0][1]
        for start, value in points:
            if start > t:
                break
            current = value
        return current
    duration = points[-1][0] + max(60.0, points[-1][0] - points[-2][0] if len(points) > 1 else 600.0)
    return Scenario(Path(path).stem, duration, rate, _const(alpha), f"trace {path}")


def adjusted(sc: Scenario, duration: float | None = None, load: float = 1.0,
             startup_s: float | None = None, min_replicas: int | None = None,
             scale_down_s: int | None = None) -> Scenario:
    """A scenario cut short, with its arrival rate scaled, another pod start-up time, or the service
    declaring another `autoscaling.minReplicas` (a floor kept as burst headroom) or
    `scaleDownStabilizationSeconds`."""
    from dataclasses import replace

    rate = sc.rate if load == 1.0 else (lambda t, f=sc.rate: f(t) * load)
    name = sc.name if load == 1.0 else f"{sc.name}@x{load:g}"
    service = sc.service
    if min_replicas is not None:
        service = {**service, "autoscaling": {**service["autoscaling"], "minReplicas": min_replicas}}
        name = f"{name}+minReplicas={min_replicas}"
    if scale_down_s is not None:
        service = {**service, "autoscaling": {**service["autoscaling"], "scaleDownStabilizationSeconds": scale_down_s}}
        name = f"{name}+scaleDown={scale_down_s}s"
    return replace(sc, name=name, rate=rate, duration_s=duration or sc.duration_s, service=service,
                   startup_s=sc.startup_s if startup_s is None else startup_s)
