"""Closed loop on real engines: the sim-to-real trace on `specfleet up` with SmolLM2-135M, speculation
auto / always on / always off.

Each mode gets a fresh `specfleet up` (no prefix cache carries over) of manifests/examples/smollm2-cpu.yaml
with one fixed replica (`spec.replicas: 1`, so the batch grows with the clients) and
`spec.speculation.mode` set to the mode. Closed-loop clients follow `SIM_TO_REAL.at(t)`
(sim/trace.py): client i is active while i < clients(t) and then sends its next streaming
chat completion (temperature 0, `ignore_eos`, the trace's max_tokens) as soon as the last one ends. Prompts
are the phase's workload from benchmarks/speculation.py (copy-heavy: repeat or lightly edit code given in
the prompt; open-ended: stories, explanations), drawn per client from the same seed in every mode.

Per phase (requests counted in the phase they finish in): output tokens/s, goodput (tokens/s of requests
whose TTFT meets the CR's ttftP99Ms and whose mean time per output token meets its itlP99Ms, the engine's
own SLO-met rule), TTFT p50/p99 (client side, through the gateway), ITL p50/p99 (the engine's
`vllm:inter_token_latency_seconds` histogram over the phase, interpolated within buckets as
histogram_quantile does, since a speculative step streams several tokens in one chunk), client-side TPOT
p50/p99, mean batch (`specfleet:batch_size` over the phase), the share of samples (1 s apart) in which
the engine's /admin/speculation said on, and while on the draft tokens per sequence-step and the share
of them accepted. Switches come from `status.lastDecisions` and the Events.

Checks: auto's goodput >= max(on, off) - 3% in every phase and above both overall; in auto, speculation
goes off (BatchAboveThreshold) within two control intervals of the batch crossing above the threshold
the operator reports (its `SpeculationActive` message, x (1 + hysteresis)) and back on (SpeculationPays)
within two intervals of it falling below threshold x (1 - hysteresis), one switch per crossing. Only a
crossing away from the state in force is due a switch: one into the state already held (above the
threshold when already off) or below it while off for low acceptance is not, and passes unless a switch
against it follows. Each repeat's verdict is ok, failed, or "not exercised" (no crossing was due). The
reported threshold is the edge of the controller's dead band in the priced speed-up (below 1 - band
while on, above 1 + band while off), so a batch that stays inside the band crosses nothing.

    .venv/bin/python benchmarks/closed_loop.py                      # 3 x ~11 min; writes results/closed_loop.json
    .venv/bin/python benchmarks/closed_loop.py --scale 0.1 --modes auto --out /tmp/cl.json   # a quick check

Timeline: before each mode's `up` stops, the fleet's Prometheus (`up` runs one when `prometheus` is on
PATH) is asked for range queries over the run at its scrape interval (benchmarks/timeline.py): request
rate and mean batch, desired and ready replicas, speculation on/off and k, TTFT and ITL p99 with the SLO
targets, and the error budget's burn rate. The data goes into the JSON (`runs.<mode>.timeline`, first
repeat) and is drawn as `<out stem>_timeline_<mode>.png` beside it; `--render-only JSON` draws them again
from a JSON alone. Without Prometheus the images are skipped with one line.

The control interval and speculation dwell are shortened for the benchmark (--interval 5 s, --dwell 10 s
by default, through SPECFLEET_CONTROL_INTERVAL / SPECFLEET_SPECULATION_DWELL).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

import yaml

import timeline                                  # benchmarks/timeline.py: the run's picture from Prometheus
from speculation import COPY_TASKS, OPEN_TASKS   # benchmarks/speculation.py: the same prompt sets

from specfleet.operator.control.speculation import SpeculationPolicy
from specfleet.operator.control.window import Histogram, quantile
from specfleet.sim.trace import SIM_TO_REAL, Trace

from provenance import stamp                     # benchmarks/provenance.py: command, commit, machine, date

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
EXAMPLE = ROOT / "manifests/examples/smollm2-cpu.yaml"
OUT = Path(__file__).parent / "results" / "closed_loop.json"
MODES = ("auto", "on", "off")
PROMPTS = {"copy-heavy": COPY_TASKS, "open-ended": OPEN_TASKS}
OFF_REASONS, ON_REASONS = ("BatchAboveThreshold",), ("SpeculationPays",)
ACCEPTANCE_REASONS = ("LowAcceptance",)
HYSTERESIS = SpeculationPolicy().batch_hysteresis
GOODPUT_MARGIN = 0.03


@dataclass(frozen=True)
class Settings:
    trace: Trace
    modes: tuple[str, ...] = MODES
    interval_s: float = 5.0
    dwell_s: float = 10.0
    seed: int = 0
    repeats: int = 1
    port: int = 8790
    ready_timeout_s: float = 600.0
    logs_dir: Path | None = None         # where each run's `specfleet up` logs are copied (None: dropped)
    speculation: tuple[tuple[str, object], ...] = ()     # more spec.speculation fields (promptLookupMin, ...)
    slo: tuple[tuple[str, object], ...] = ()             # spec.slo fields to change (itlP99Ms, ...)


# -- the fleet ---------------------------------------------------------------------------------------------
def manifest(mode: str, speculation: tuple[tuple[str, object], ...] = (),
             slo: tuple[tuple[str, object], ...] = ()) -> dict:
    """The example CR with one fixed replica, speculation forced to `mode` and given `speculation`'s fields,
    its SLO changed by `slo`'s."""
    if mode not in MODES:
        raise ValueError(f"speculation mode must be one of {', '.join(MODES)}, got {mode!r}")
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["replicas"] = 1
    doc["spec"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 1}
    doc["spec"]["speculation"].update(speculation, mode=mode)
    doc["spec"]["slo"].update(slo)
    return doc


class Fleet:
    """One `specfleet up` in a temporary folder: the gateway, the API emulator, the pod's endpoints."""

    def __init__(self, workdir: Path, doc: dict, port: int, proc: subprocess.Popen):
        self.workdir, self.doc, self.port, self.proc = workdir, doc, port, proc
        self.state = workdir / "state"
        self.name, self.namespace = doc["metadata"]["name"], doc["metadata"]["namespace"]
        self.model = doc["spec"]["model"]["name"]
        self.gateway = f"http://127.0.0.1:{port}/v1"

    @property
    def api(self) -> str:
        return json.loads((self.state / "fleet.json").read_text())["api"]

    @property
    def prometheus(self) -> str | None:
        """The fleet's Prometheus URL (None when `up` runs without one)."""
        return json.loads((self.state / "fleet.json").read_text()).get("prometheus")

    def get(self, path: str, token: str | None = None, timeout: float = 5.0) -> dict:
        url = path if path.startswith("http") else self.api + path
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as response:
            return json.loads(response.read())

    def service(self) -> dict:
        return self.get(f"/apis/specfleet.io/v1alpha1/namespaces/{self.namespace}/inferenceservices/{self.name}")

    def events(self) -> list[dict]:
        return self.get(f"/api/v1/namespaces/{self.namespace}/events").get("items", [])

    def pod(self) -> tuple[str, str] | None:
        """(endpoint URL, admin token) of the Ready pod, found as the operator finds it."""
        for pod in self.get(f"/api/v1/namespaces/{self.namespace}/pods").get("items", []):
            ready = any(c["type"] == "Ready" and c["status"] == "True"
                        for c in (pod.get("status") or {}).get("conditions") or [])
            if ready:
                port = pod["spec"]["containers"][0]["ports"][0]["containerPort"]
                tokens = list((self.state / "pods").glob(f"{self.namespace}_{pod['metadata']['name']}/volumes/*/token"))
                return f"http://{pod['status']['podIP']}:{port}", tokens[0].read_text().strip() if tokens else None
        return None

    def log_tail(self, chars: int = 3000) -> str:
        log = self.workdir / "up.log"
        return log.read_text()[-chars:] if log.exists() else ""


@contextmanager
def fleet_up(doc: dict, settings: Settings):
    """`specfleet up -f CR` with the benchmark's interval and dwell; Ctrl-C'd (its whole group) on exit."""
    with tempfile.TemporaryDirectory(prefix="closed-loop-") as tmp:
        workdir = Path(tmp)
        cr = workdir / "svc.yaml"
        cr.write_text(yaml.safe_dump(doc))
        env = {**os.environ, "SPECFLEET_CONTROL_INTERVAL": f"{settings.interval_s:g}",
               "SPECFLEET_SPECULATION_DWELL": f"{settings.dwell_s:g}", "SPECFLEET_DETECT_INTERVAL": "0"}
        with open(workdir / "up.log", "w") as log:
            proc = subprocess.Popen([str(BIN / "specfleet"), "up", "-f", str(cr), "--port", str(settings.port),
                                     "--plain", "--state-dir", str(workdir / "state")], cwd=workdir, env=env,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        fleet = Fleet(workdir, doc, settings.port, proc)
        try:
            wait(lambda: fleet.pod() is not None and "ready: model" in fleet.log_tail(100_000),
                 settings.ready_timeout_s, "the first ready replica", fleet)
            yield fleet
        finally:
            stop(proc)
            if settings.logs_dir is not None:
                keep_logs(workdir, settings.logs_dir / f"{doc['spec']['speculation']['mode']}-{int(time.time())}")


def keep_logs(workdir: Path, into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    shutil.copy(workdir / "up.log", into)
    if (workdir / "state/logs").is_dir():
        shutil.copytree(workdir / "state/logs", into / "logs", dirs_exist_ok=True)
    if (workdir / "state/prometheus").is_dir():      # its TSDB too: the timeline can be queried again from it
        shutil.copytree(workdir / "state/prometheus", into / "prometheus", dirs_exist_ok=True)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def wait(probe, timeout: float, what: str, fleet: Fleet) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fleet.proc.poll() is not None:
            raise RuntimeError(f"specfleet up exited ({fleet.proc.returncode}) before {what}:\n{fleet.log_tail()}")
        try:
            if probe():
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}:\n{fleet.log_tail()}")


# -- clients -----------------------------------------------------------------------------------------------
@dataclass
class Request:
    client: int
    workload: str
    start: float                 # seconds since the trace started
    end: float = 0.0
    ttft_s: float | None = None
    tokens: int = 0
    error: str = ""

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.tokens < 2:
            return None
        return (self.end - self.start - self.ttft_s) / (self.tokens - 1)


def one_request(client, model: str, text: str, max_tokens: int, seed: int, req: Request, clock) -> None:
    try:
        stream = client.chat.completions.create(
            model=model, stream=True, max_tokens=max_tokens, temperature=0, seed=seed,
            messages=[{"role": "user", "content": text}], stream_options={"include_usage": True},
            extra_body={"ignore_eos": True})
        for chunk in stream:
            if req.ttft_s is None and chunk.choices and chunk.choices[0].delta.content:
                req.ttft_s = clock() - req.start
            if chunk.usage is not None:
                req.tokens = chunk.usage.completion_tokens
    except Exception as exc:  # noqa: BLE001  (a failed request is a figure, not a crash)
        req.error = repr(exc)[:200]
    req.end = clock()


def run_clients(fleet: Fleet, trace: Trace, seed: int, t0: float, on_tick=lambda t: None) -> list[Request]:
    """Closed-loop clients per `trace.at(t)`, t seconds since monotonic `t0`, until the trace ends; waits
    for the requests in flight."""
    from openai import OpenAI

    client = OpenAI(base_url=fleet.gateway, api_key="unused", max_retries=0, timeout=600)
    clock = lambda: time.monotonic() - t0                                          # noqa: E731
    width = max(max(p.clients_from, p.clients_to) for p in trace.phases)
    done: list[Request] = []

    def user(i: int) -> None:
        rng = random.Random(seed * 100_003 + i)
        while (now := clock()) < trace.duration:
            phase, active = trace.at(now)
            if i >= active:
                time.sleep(0.2)
                continue
            req = Request(i, phase.workload, now)
            prompts = PROMPTS[phase.workload]
            one_request(client, fleet.model, prompts[rng.randrange(len(prompts))], trace.max_tokens,
                        rng.randrange(2**31), req, clock)
            done.append(req)

    users = [threading.Thread(target=user, args=(i,), daemon=True) for i in range(width)]
    for u in users:
        u.start()
    while clock() < trace.duration:
        on_tick(clock())
        time.sleep(0.5)
    for u in users:
        u.join(600)
    return done


# -- the engine's and the operator's side --------------------------------------------------------------------
@dataclass
class Sample:
    t: float
    counters: dict[str, float]            # cumulative /metrics values the report needs
    itl_buckets: list[tuple[float, float]]
    speculating: bool | None
    threshold: int | None
    reason: str | None = None             # the SpeculationActive condition's reason (why it holds)
    scales: tuple[float, float] | None = None   # status.calibration's (decodeScale, verifyScale), once online


SERIES = ("specfleet:batch_size_sum", "specfleet:batch_size_count", "vllm:generation_tokens_total",
          "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
          "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total",
          "specfleet:spec_decode_seq_steps_total")


def scrape(url: str) -> tuple[dict[str, float], list[tuple[float, float]]]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    counters, buckets = {}, []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in SERIES:
                counters[s.name] = s.value
            elif s.name == "vllm:inter_token_latency_seconds_bucket":
                buckets.append((float(s.labels["le"]), s.value))
    return counters, sorted(buckets)


THRESHOLD = re.compile(r"pays up to batch (\d+)")


def reported_scales(service: dict) -> tuple[float, float] | None:
    calibration = (service.get("status") or {}).get("calibration") or {}
    if "decodeScale" not in calibration:
        return None
    return calibration["decodeScale"], calibration["verifyScale"]


PLANNED_REASONS = ("Planned", "NotPaying", None)     # SpeculationActive as the plan sets it, before the loop speaks


def reported_threshold(service: dict) -> tuple[int | None, str | None]:
    """The break-even batch the operator last reported (its SpeculationActive message; the plan's while
    the condition is still the plan's) and the condition's reason. A controller message without one (a
    depth retune for cost) reports none: the plan's figure is not what the controller decides by."""
    status = service.get("status") or {}
    cond = next((c for c in status.get("conditions") or [] if c["type"] == "SpeculationActive"), {})
    if m := THRESHOLD.search(cond.get("message", "")):
        return int(m.group(1)), cond.get("reason")
    if cond.get("reason") not in PLANNED_REASONS:
        return None, cond.get("reason")
    return ((status.get("plan") or {}).get("predicted") or {}).get("maxBatchForSpeculation"), cond.get("reason")


class Poller(threading.Thread):
    """Once a second: the pod's /metrics, its /admin/speculation state, and the threshold in status."""

    def __init__(self, fleet: Fleet, t0: float):
        super().__init__(daemon=True)
        self.fleet, self.t0 = fleet, t0
        self.samples: list[Sample] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                self.samples.append(self.sample())
            except (OSError, ValueError, KeyError, TypeError):
                pass           # a missed sample (no Ready pod yet, a timeout); the next one is a second away
            self.halt.wait(1.0)

    def sample(self) -> Sample:
        url, token = self.fleet.pod()
        counters, buckets = scrape(url)
        speculating = self.fleet.get(url + "/admin/speculation", token)["enabled"] if token else None
        service = self.fleet.service()
        return Sample(time.monotonic() - self.t0, counters, buckets, speculating, *reported_threshold(service),
                      reported_scales(service))


# -- the timeline (benchmarks/timeline.py) ----------------------------------------------------------------------
TIMELINE_LEAD_S = 10.0      # the picture starts this long before the trace: the fleet idle, as the load finds it


def fleet_timeline(fleet: Fleet, trace: Trace, t0_wall: float, switched: list[dict], settings: Settings,
                   targets: tuple[float, float]) -> dict:
    """The run's range data from the fleet's Prometheus, queried while `up` (and so it) still runs, with
    what the benchmark knows beside it: active clients, phases, switches, SLO targets."""
    url = fleet.prometheus
    if url is None:
        return {"skipped": "this fleet ran no Prometheus (prometheus is not on PATH)"}
    try:
        step = timeline.scrape_interval_s(url)
        time.sleep(step + 0.5)                       # the run's last scrape lands
        span = timeline.Span(fleet.namespace, fleet.name, t0_wall - TIMELINE_LEAD_S, time.time(), t0_wall,
                             step, rate_window_s=max(5 * step, settings.interval_s))
        data = timeline.collect(url, span)
    except (OSError, ValueError, RuntimeError) as exc:
        return {"skipped": f"Prometheus at {url}: {exc}"[:300]}
    return {**data, "clients": clients_series(trace, span), "slo_s": {"ttft": targets[0], "itl": targets[1]},
            "spec_replicas": fleet.doc["spec"].get("replicas"),
            "phases": [[name, round(start, 2), round(end, 2)] for name, start, end in trace.bounds()],
            "switches": [{k: s[k] for k in ("t", "enabled", "k", "reason")} for s in switched]}


def clients_series(trace: Trace, span: timeline.Span) -> list[list[float]]:
    """[[t, clients sending]] at the span's steps: the trace's count while it runs, 0 before and after."""
    out, t = [], span.start - span.t0
    while t <= span.end - span.t0:
        out.append([round(t, 2), trace.at(t)[1] if 0 <= t < trace.duration else 0])
        t += span.step_s
    return out


def render_timelines(result: dict, out: Path) -> None:
    """One PNG per mode beside the JSON (`<stem>_timeline_<mode>.png`), from the first repeat's timeline."""
    config, skipped = result["config"], {}
    for mode, run in result["runs"].items():
        data = run.get("timeline") or {"skipped": "the run has no timeline (an older JSON)"}
        if "skipped" in data:
            skipped.setdefault(data["skipped"], []).append(mode)
            continue
        repeat = f", repeat 1 of {run['repeats']}" if run.get("repeats", 1) > 1 else ""
        title = f"Closed loop on real engines: speculation mode {mode}{repeat}"
        subtitle = f"{config['command']}   ({config['date']}, {config['cpus']} CPUs)"
        path = timeline.render(data, out.with_name(f"{out.stem}_timeline_{mode}.png"), title, subtitle)
        print(f"wrote {path}")
    for why, modes in skipped.items():
        print(f"no timeline image ({', '.join(modes)}): {why}")


# -- reduction -------------------------------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


def itl_histogram(sample: Sample) -> Histogram:
    return Histogram(tuple(le for le, _ in sample.itl_buckets), tuple(count for _, count in sample.itl_buckets))


def between(samples: list[Sample], start: float, end: float) -> tuple[Sample, Sample] | None:
    """The first sample at or after `start` and the last at or before `end` (None if fewer than two)."""
    inside = [s for s in samples if start - 0.5 <= s.t <= end + 0.5 and s.counters]
    return (inside[0], inside[-1]) if len(inside) >= 2 else None


def delta(pair: tuple[Sample, Sample] | None, name: str) -> float | None:
    if pair is None or name not in pair[0].counters or name not in pair[1].counters:
        return None
    return pair[1].counters[name] - pair[0].counters[name]


def span_figures(requests: list[Request], samples: list[Sample], start: float, end: float, targets) -> dict:
    """The figures of one span of the run (a phase or the whole trace)."""
    ttft_target, itl_target = targets
    ended = [r for r in requests if start <= r.end < end and not r.error]
    good = [r for r in ended if r.ttft_s is not None and r.ttft_s <= ttft_target
            and r.tpot_s is not None and r.tpot_s <= itl_target]
    seconds = end - start
    pair = between(samples, start, end)
    count = delta(pair, "specfleet:batch_size_count")
    itl = (itl_histogram(pair[1]).minus(itl_histogram(pair[0]))
           if pair and len(pair[0].itl_buckets) == len(pair[1].itl_buckets) else None)
    states = [s.speculating for s in samples if start <= s.t < end and s.speculating is not None]
    scales = [s.scales for s in samples if start <= s.t < end and s.scales is not None]
    median = lambda values: round(statistics.median(values), 3) if values else None      # noqa: E731
    ms = lambda v: None if v is None else round(v * 1000, 1)                      # noqa: E731
    return {"throughput_tok_s": round(sum(r.tokens for r in ended) / seconds, 2),
            "goodput_tok_s": round(sum(r.tokens for r in good) / seconds, 2),
            "ttft_p50_ms": ms(percentile([r.ttft_s for r in ended if r.ttft_s is not None], 0.5)),
            "ttft_p99_ms": ms(percentile([r.ttft_s for r in ended if r.ttft_s is not None], 0.99)),
            "itl_p50_ms": ms(quantile(itl, 0.5)), "itl_p99_ms": ms(quantile(itl, 0.99)),
            "tpot_p50_ms": ms(percentile([r.tpot_s for r in ended if r.tpot_s is not None], 0.5)),
            "tpot_p99_ms": ms(percentile([r.tpot_s for r in ended if r.tpot_s is not None], 0.99)),
            "batch_mean": round(delta(pair, "specfleet:batch_size_sum") / count, 2) if count else None,
            "prefix_hit_share": _ratio(delta(pair, "vllm:prefix_cache_hits_total"),
                                       delta(pair, "vllm:prefix_cache_queries_total")),
            "speculation_on_share": round(sum(states) / len(states), 3) if states else None,
            # what a speculating sequence-step drafted and what of it was accepted: the replay's inputs
            "draft_tokens_per_seq_step": _ratio(delta(pair, "vllm:spec_decode_num_draft_tokens_total"),
                                                delta(pair, "specfleet:spec_decode_seq_steps_total")),
            "acceptance": _ratio(delta(pair, "vllm:spec_decode_num_accepted_tokens_total"),
                                 delta(pair, "vllm:spec_decode_num_draft_tokens_total")),
            "decode_scale": median([d for d, _ in scales]), "verify_scale": median([v for _, v in scales]),
            "requests": len(ended), "failed": sum(1 for r in requests if start <= r.end < end and r.error)}


def _ratio(part: float | None, whole: float | None) -> float | None:
    return round(part / whole, 3) if part is not None and whole else None


SWITCH = re.compile(r"speculation (on k=(\d+)|off) \((\w+)\)")


def switches(fleet: Fleet, t0_wall: float) -> list[dict]:
    """Speculation switches from the Events (all of them kept; `status.lastDecisions` holds the last 20),
    each with the batch its message reports and whether `lastDecisions` lists it too."""
    decided = {(d["time"][:19], d["to"].startswith("on"), d["reason"])
               for d in (fleet.service().get("status") or {}).get("lastDecisions") or [] if d["kind"] == "speculation"}
    events = sorted((e for e in fleet.events() if e.get("reason") in ("SpeculationOn", "SpeculationOff")),
                    key=lambda e: e.get("lastTimestamp") or "")
    out = []
    for e in events:
        m = SWITCH.match(e["message"])
        if m is None:
            continue
        enabled, stamp = m.group(1).startswith("on"), e["lastTimestamp"]
        batch = re.search(r"batch (\d+(?:\.\d+)?)", e["message"])
        threshold = THRESHOLD.search(e["message"])
        out.append({"t": round(_epoch(stamp) - t0_wall, 1), "enabled": enabled,
                    "k": int(m.group(2)) if m.group(2) else None, "reason": m.group(3),
                    "batch": float(batch.group(1)) if batch else None,
                    "threshold": int(threshold.group(1)) if threshold else None,
                    "in_last_decisions": (stamp[:19], enabled, m.group(3)) in decided, "message": e["message"]})
    return out


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def batch_series(samples: list[Sample], window_s: float) -> list[tuple[float, float, int | None, str | None]]:
    """(t, mean batch over the last `window_s`, threshold and SpeculationActive reason reported then), as
    the operator's window sees it."""
    out = []
    for i, s in enumerate(samples):
        j = next((j for j in range(i, -1, -1) if s.t - samples[j].t >= window_s), None)
        if j is None or not s.counters or not samples[j].counters:
            continue
        count = s.counters.get("specfleet:batch_size_count", 0) - samples[j].counters.get("specfleet:batch_size_count", 0)
        if count > 0:
            mean = (s.counters["specfleet:batch_size_sum"] - samples[j].counters["specfleet:batch_size_sum"]) / count
            out.append((s.t, mean, s.threshold, s.reason))
    return out


def crossings(series: list[tuple], hysteresis: float = HYSTERESIS) -> list[dict]:
    """Times the batch rose above threshold x (1 + h) ("off" due) or fell below threshold x (1 - h) ("on" due)."""
    out, high = [], False
    for t, batch, threshold, _ in series:
        if threshold is None:
            continue
        if not high and batch > threshold * (1 + hysteresis):
            high = True
            out.append({"t": round(t, 1), "enabled": False, "batch": round(batch, 2), "threshold": threshold})
        elif high and batch < threshold * (1 - hysteresis):
            high = False
            out.append({"t": round(t, 1), "enabled": True, "batch": round(batch, 2), "threshold": threshold})
    return out


def held_states(switched: list[dict], initially_on: bool = True) -> list[tuple[float, bool, str | None]]:
    """[(from t, enabled, the reason it was set for)], the state's history from the switches. A depth retune
    happens only while on, so a run whose first switch is one started on; otherwise it started in the state
    its first on/off switch left (`initially_on` where nothing switched)."""
    first = switched[0] if switched else None
    start = initially_on if first is None else (first["reason"] == "DepthRetuned" or not first["enabled"])
    states = [(float("-inf"), start, None)]
    for s in switched:
        if s["reason"] != "DepthRetuned" and s["enabled"] != states[-1][1]:
            states.append((s["t"], s["enabled"], s["reason"]))
    return states


def state_at(states: list[tuple[float, bool, str | None]], t: float) -> tuple[bool, str | None]:
    return next((on, why) for since, on, why in reversed(states) if since <= t)


def switch_checks(crossed: list[dict], switched: list[dict], interval_s: float, initially_on: bool = True) -> dict:
    """Judges the batch-driven switches against the crossings of the reported threshold.

    A crossing is *due* a switch when it points away from the state in force (above the threshold while
    on, below it while off) and that state is not held for low acceptance, which the batch does not
    govern. A due crossing is answered by one on/off switch in its direction, for the batch's reason,
    within two intervals, and no other on/off switch before the next crossing. A crossing that is not due
    (into the state already held, or below the threshold while off for low acceptance) passes unless a
    switch against its direction follows it before the next crossing. A batch-reason switch before the
    first crossing answers nothing: flapping. `verdict` is "ok", "failed", or "not exercised" (nothing
    failed and no crossing was due, so the batch direction went untested). Depth retunes while on are
    counted apart; low-acceptance switches are reported, not judged."""
    retuned = [s for s in switched if s["reason"] == "DepthRetuned"]
    states = held_states(switched, initially_on)
    switched = [s for s in switched if s["reason"] != "DepthRetuned"]
    # each crossing's window runs to where the next one's opens, an interval before it: the controller may
    # answer a crossing a little before this script's batch window shows it, and that switch is the next's
    bounds = [c["t"] - interval_s for c in crossed[1:]] + [float("inf")]
    matched = []
    for c, until in zip(crossed, bounds):
        held, why = state_at(states, c["t"] - interval_s)
        due = held != c["enabled"] and why not in ACCEPTANCE_REASONS
        mine = [s for s in switched if c["t"] - interval_s <= s["t"] < until and s["reason"] not in ACCEPTANCE_REASONS]
        right = [s for s in mine if s["enabled"] == c["enabled"]]
        lag = round(right[0]["t"] - c["t"], 1) if right else None
        if due:
            ok = (len(mine) == 1 and lag is not None and lag <= 2 * interval_s
                  and right[0]["reason"] in (ON_REASONS if c["enabled"] else OFF_REASONS))
        else:
            ok = all(s["enabled"] == c["enabled"] for s in mine)
        matched.append({**c, "due": due, "held": "on" if held else "off", "held_for": why, "switches": len(mine),
                        "lag_s": lag, "ok": ok})
    first = crossed[0]["t"] - interval_s if crossed else float("inf")
    unprompted = [s for s in switched if s["t"] < first and s["reason"] in ON_REASONS + OFF_REASONS]
    failed = bool(unprompted) or not all(m["ok"] for m in matched)
    due_count = sum(m["due"] for m in matched)
    verdict = "failed" if failed else "ok" if due_count else "not exercised"
    return {"crossings": matched, "due_crossings": due_count, "unprompted_switches": len(unprompted),
            "depth_retunes": len(retuned),
            "low_acceptance_switches": sum(s["reason"] in ACCEPTANCE_REASONS for s in switched),
            "verdict": verdict, "ok": verdict == "ok"}


def switch_summary(checks: list[dict]) -> dict:
    verdicts = [c["verdict"] for c in checks]
    return {"ok": bool(verdicts) and all(v == "ok" for v in verdicts),
            "verdicts": {v: verdicts.count(v) for v in ("ok", "not exercised", "failed") if v in verdicts},
            "low_acceptance_switches": sum(c["low_acceptance_switches"] for c in checks)}


# -- one run, all runs -----------------------------------------------------------------------------------------
def run_mode(mode: str, settings: Settings, progress=None) -> dict:
    doc = manifest(mode, settings.speculation, settings.slo)
    slo = doc["spec"]["slo"]
    targets = (slo["ttftP99Ms"] / 1000, slo["itlP99Ms"] / 1000)
    trace = settings.trace
    with fleet_up(doc, settings) as fleet:
        t0, t0_wall = time.monotonic(), time.time()
        poller = Poller(fleet, t0)
        poller.start()
        task = progress.add_task(f"{mode}", total=trace.duration) if progress else None
        tick = (lambda t: progress.update(task, completed=t)) if progress else (lambda t: None)
        requests = run_clients(fleet, trace, settings.seed, t0, tick)
        poller.halt.set()
        poller.join(10)
        switched = switches(fleet, t0_wall)
        calibration = (fleet.service().get("status") or {}).get("calibration")    # what priced the steps at the end
        picture = fleet_timeline(fleet, trace, t0_wall, switched, settings, targets)
    samples = poller.samples
    phases = {name: span_figures(requests, samples, start, end, targets) for name, start, end in trace.bounds()}
    series = batch_series(samples, settings.interval_s)
    crossed = crossings(series)
    thresholds = sorted({s.threshold for s in samples if s.threshold is not None})
    return {"phases": phases, "overall": span_figures(requests, samples, 0.0, trace.duration, targets),
            "switches": switched, "thresholds_reported": thresholds, "calibration": calibration,
            # [t, window batch, threshold, SpeculationActive reason]
            "batch_series": [[round(t, 1), round(b, 2), th, why] for t, b, th, why in series],
            "requests": {"sent": len(requests), "failed": sum(1 for r in requests if r.error),
                         "errors": sorted({r.error for r in requests if r.error})[:3]},
            "switch_check": switch_checks(crossed, switched, settings.interval_s, initially_on(samples))
            if mode == "auto" else None,
            "timeline": picture}


def initially_on(samples: list[Sample]) -> bool:
    return next((s.speculating for s in samples if s.speculating is not None), True)


def goodput_checks(runs: dict) -> dict:
    """auto >= max(on, off) - 3% per phase and above both overall (only with all three modes)."""
    if not all(m in runs for m in MODES):
        return {"ran": False, "why": "needs all three modes"}
    per_phase = {}
    for phase, auto in runs["auto"]["phases"].items():
        fixed = {m: runs[m]["phases"][phase]["goodput_tok_s"] for m in ("on", "off")}
        best = max(fixed, key=fixed.get)
        policy = auto_policy(runs["auto"]["spread"][phase])
        per_phase[phase] = {"auto": auto["goodput_tok_s"], "best_fixed": fixed[best], "best_mode": best,
                            "ok": auto["goodput_tok_s"] >= fixed[best] * (1 - GOODPUT_MARGIN),
                            "auto_policy": policy,
                            # auto held one fixed setting all phase, every repeat: its gap to that mode is
                            # between two runs of one policy, the run-to-run noise, not a decision
                            "gap_to_same_policy": (round(auto["goodput_tok_s"] / fixed[policy] - 1, 3)
                                                   if policy in fixed else None),
                            "chose_best_fixed": policy == best}
    overall = {m: runs[m]["overall"]["goodput_tok_s"] for m in MODES}
    return {"ran": True, "per_phase": per_phase, "overall": overall,
            "overall_ok": overall["auto"] > max(overall["on"], overall["off"]),
            "ok": all(p["ok"] for p in per_phase.values()) and overall["auto"] > max(overall["on"], overall["off"])}


def auto_policy(spread: dict) -> str:
    """"on" or "off" where speculation stayed in that state through a phase in every repeat, else "switched"
    (k may still have moved: the on mode retunes k as auto does)."""
    share = spread["speculation_on_share"]
    return {(1.0, 1.0): "on", (0.0, 0.0): "off"}.get(tuple(share) if share else None, "switched")


def median_run(repeats: list[dict]) -> dict:
    """The median of every figure over repeats, with [min, max] under `spread`; switches of the first."""
    def fold(figures: list[dict]) -> tuple[dict, dict]:
        med, spread = {}, {}
        for key in figures[0]:
            values = [f[key] for f in figures if f[key] is not None]
            med[key] = statistics.median(values) if values else None
            spread[key] = [min(values), max(values)] if values else None
        return med, spread

    first = repeats[0]
    phases, spreads = {}, {}
    for phase in first["phases"]:
        phases[phase], spreads[phase] = fold([r["phases"][phase] for r in repeats])
    overall, spreads["overall"] = fold([r["overall"] for r in repeats])
    return {**first, "phases": phases, "overall": overall, "spread": spreads, "repeats": len(repeats),
            "goodput_per_repeat": {**{phase: [r["phases"][phase]["goodput_tok_s"] for r in repeats]
                                      for phase in first["phases"]},
                                   "overall": [r["overall"]["goodput_tok_s"] for r in repeats]},
            "switches_per_repeat": [r["switches"] for r in repeats],
            "switch_checks_per_repeat": [r["switch_check"] for r in repeats]}


def run_all(settings: Settings) -> dict:
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    runs: dict[str, list[dict]] = {m: [] for m in settings.modes}
    with Progress(TextColumn("{task.description:>8}"), BarColumn(), TextColumn("{task.completed:>5.0f} s"),
                  TimeRemainingColumn()) as progress:
        for _ in range(settings.repeats):
            for mode in settings.modes:
                runs[mode].append(run_mode(mode, settings, progress))
    merged = {m: median_run(r) for m, r in runs.items()}
    checks = {"goodput": goodput_checks(merged)}
    if "auto" in merged:
        checks["switches"] = switch_summary(merged["auto"]["switch_checks_per_repeat"])
    return {"config": config(settings), "runs": merged, "checks": checks}


def cr_fields(pairs: list[str], parser: argparse.ArgumentParser) -> tuple[tuple[str, object], ...]:
    """FIELD=VALUE pairs, each value read as YAML (numbers stay numbers)."""
    fields = []
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            parser.error(f"--speculation and --slo take FIELD=VALUE, got {pair!r}")
        fields.append((name, yaml.safe_load(value)))
    return tuple(fields)


def config(settings: Settings) -> dict:
    doc = manifest("auto", settings.speculation, settings.slo)
    return {"command": " ".join([".venv/bin/python", "benchmarks/closed_loop.py", *sys.argv[1:]]),
            "trace": {"phases": [asdict(p) for p in settings.trace.phases], "max_tokens": settings.trace.max_tokens},
            "modes": list(settings.modes), "control_interval_s": settings.interval_s,
            "speculation_dwell_s": settings.dwell_s, "batch_hysteresis": HYSTERESIS, "seed": settings.seed,
            "repeats": settings.repeats, "manifest": str(EXAMPLE.relative_to(ROOT)), "replicas": 1,
            "slo": doc["spec"]["slo"], "speculation": doc["spec"]["speculation"], "goodput": "tokens/s of requests with TTFT <= ttftP99Ms and mean time "
            "per output token <= itlP99Ms", "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                           time.gmtime())}


# -- report ----------------------------------------------------------------------------------------------------
COLUMNS = (("throughput_tok_s", "tok/s"), ("goodput_tok_s", "goodput"), ("ttft_p50_ms", "TTFT p50"),
           ("ttft_p99_ms", "TTFT p99"), ("itl_p50_ms", "ITL p50"), ("itl_p99_ms", "ITL p99"),
           ("batch_mean", "batch"), ("speculation_on_share", "spec on"))


def print_report(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="closed loop on real engines (SmolLM2-135M, 1 CPU replica)")
    for header in ("mode", "phase", *(label for _, label in COLUMNS)):
        table.add_column(header, justify="right")
    for mode, run in result["runs"].items():
        for phase, figures in [*run["phases"].items(), ("overall", run["overall"])]:
            table.add_row(mode, phase, *("-" if figures[k] is None else f"{figures[k]:g}" for k, _ in COLUMNS))
    console = Console(width=max(140, Console().width))
    console.print(table)
    for mode, run in result["runs"].items():
        for s in run["switches"]:
            console.print(f"{mode}: t={s['t']:>6} s  {'on ' if s['enabled'] else 'off'} k={s['k']}  "
                          f"{s['reason']}  batch {s['batch']}")
    console.print(f"checks: {json.dumps(result['checks'])}")


def recheck(path: Path) -> None:
    result = json.loads(path.read_text())
    result["checks"]["goodput"] = goodput_checks(result["runs"])
    auto = result["runs"].get("auto")
    if auto:
        interval = result["config"]["control_interval_s"]
        auto["switch_checks_per_repeat"] = [
            switch_checks([{k: c[k] for k in ("t", "enabled", "batch", "threshold")} for c in check["crossings"]],
                          switched, interval)
            for check, switched in zip(auto["switch_checks_per_repeat"], auto["switches_per_repeat"])]
        auto["switch_check"] = auto["switch_checks_per_repeat"][0]
        result["checks"]["switches"] = switch_summary(auto["switch_checks_per_repeat"])
    path.write_text(json.dumps(result, indent=2) + "\n")
    print_report(result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="shorten every phase by this factor")
    parser.add_argument("--phases", nargs="*", help="run only these phases of the trace (default: all)")
    parser.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES)
    parser.add_argument("--interval", type=float, default=5.0, help="control interval, seconds")
    parser.add_argument("--dwell", type=float, default=10.0, help="speculation dwell, seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--port", type=int, default=8790)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--speculation", nargs="*", default=[], metavar="FIELD=VALUE",
                        help="more spec.speculation fields of the CR, e.g. promptLookupMin=1 minAcceptanceRate=0.3")
    parser.add_argument("--slo", nargs="*", default=[], metavar="FIELD=VALUE",
                        help="spec.slo fields of the CR to change, e.g. itlP99Ms=500")
    parser.add_argument("--logs", type=Path, help="keep each run's `specfleet up` logs (and its Prometheus "
                        "folder, TSDB included) under this folder")
    parser.add_argument("--render-only", type=Path, metavar="JSON",
                        help="run nothing: draw an earlier run's timeline images again from its JSON")
    parser.add_argument("--recheck", type=Path, metavar="JSON",
                        help="run nothing: judge an earlier run's results again with this script's checks, "
                             "print them and write the file back")
    args = parser.parse_args()
    if args.render_only:
        return render_timelines(json.loads(args.render_only.read_text()), args.render_only)
    if args.recheck:
        return recheck(args.recheck)
    if args.scale <= 0 or args.repeats < 1:
        parser.error("--scale must be > 0 and --repeats >= 1")
    trace = SIM_TO_REAL.scaled(args.scale)
    if args.phases:
        unknown = set(args.phases) - {p.name for p in trace.phases}
        if unknown:
            parser.error(f"unknown phase(s) {sorted(unknown)}; the trace has {[p.name for p in trace.phases]}")
        trace = Trace(tuple(p for p in trace.phases if p.name in args.phases), trace.max_tokens, trace.seed)
    settings = Settings(trace, tuple(args.modes), args.interval, args.dwell, args.seed, args.repeats, args.port,
                        logs_dir=args.logs, speculation=cr_fields(args.speculation, parser),
                        slo=cr_fields(args.slo, parser))
    result = {**stamp("benchmarks/closed_loop.py", sys.argv[1:]), **run_all(settings)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print_report(result)
    print(f"wrote {args.out}")
    render_timelines(result, args.out)


if __name__ == "__main__":
    main()
