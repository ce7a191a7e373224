"""The figures README.md and docs/*.md quote, each rendered from one file of benchmarks/results/.

One `Figure` per quoted number or table: its id (the marker's name in the markdown), the results file it
reads, and a pure function from that file's JSON to the text the page shows. `benchmarks/report.py`
checks the pages against these and rewrites them; a number on a page outside a marker is not checked.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Figure:
    id: str
    source: str                       # a file name in benchmarks/results/
    render: Callable[[dict], str]     # the JSON -> the text between the markers


# --- formatting -------------------------------------------------------------------------------------------

def times(x: float) -> str:
    return f"{x:.2f}×"


def spread(s: dict, digits: int = 2, unit: str = "") -> str:
    """{'median', 'min', 'max'} -> 'median (min–max)'."""
    f = f"{{:.{digits}f}}"
    return f"{f.format(s['median'])}{unit} ({f.format(s['min'])}–{f.format(s['max'])})"


def span(values: list[float], fmt: Callable[[float], str] = lambda v: f"{v:.2f}") -> str:
    lo, hi = min(values), max(values)
    return fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo)}–{fmt(hi)}"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def provenance(d: dict) -> dict:
    """command, commit, machine and date: top-level in newer files, under `provenance` in back-filled ones."""
    return {k: d.get(k, d.get("provenance", {}).get(k)) for k in ("command", "commit", "machine", "date")}


def provenance_line(d: dict) -> str:
    p = provenance(d)
    m = p["machine"]
    machine = m if isinstance(m, str) else (f"{m.get('cpu') or m.get('processor', '?')}, {m.get('cpus', '?')} CPUs, "
                                             f"{m.get('platform', '?')}" if m else "not recorded")
    return (f"Command: `{p['command'] or 'not recorded'}`. Commit: `{p['commit'] or 'not recorded'}`; "
            f"date: {p['date'] or 'not recorded'}; machine: {machine}.")


# --- engine throughput ------------------------------------------------------------------------------------

ENGINE = "engine_throughput_smollm2-135m.json"
ENGINE_NAMES = {"specfleet": "specfleet", "transformers_static16": "transformers `generate`, static batches of 16",
                "vllm_cpu": "vLLM CPU 0.32"}


def engine_table(d: dict) -> str:
    rows = []
    for key, name in ENGINE_NAMES.items():
        runs = [r["tok_per_s"] for r in d["runs"][key]]
        ratio = times(d["ratios"][key]) if key in d["ratios"] else ""
        rows.append([name, f"{d['median_tok_per_s'][key]:.0f} ({min(runs):.0f}–{max(runs):.0f})",
                     ", ".join(f"{x:.1f}" for x in runs), ratio])
    return table(["engine", "output tok/s, median (min–max)", "per repeat", "specfleet ÷ engine"], rows)


# --- serving against vLLM ---------------------------------------------------------------------------------

SERVING_BF16 = "serving_bf16_zen4_row_blocks.json"
SERVING_FP32 = "serving_c8_c32_zen4_prefetch.json"


def _ratios(d: dict, metric: str) -> list[float]:
    return [c["specfleet"][metric]["median"] / c["vllm"][metric]["median"] for c in d["cells"].values() if "vllm" in c]


def serving_table(d: dict) -> str:
    rows = []
    for cell, c in d["cells"].items():
        ours, peer = c["specfleet"], c["vllm"]
        ratio = {m: ours[m]["median"] / peer[m]["median"] for m in ("output_throughput", "tpot_p50", "ttft_p50")}
        rows.append([cell.replace("@", ", c = "),
                     f"{ours['output_throughput']['median']:.0f} / {peer['output_throughput']['median']:.0f}",
                     times(ratio["output_throughput"]),
                     f"{ours['tpot_p50']['median']:.1f} / {peer['tpot_p50']['median']:.1f}", times(ratio["tpot_p50"]),
                     f"{ours['ttft_p50']['median']:.0f} / {peer['ttft_p50']['median']:.0f}", times(ratio["ttft_p50"])])
    return table(["endpoint, concurrency", "output tok/s (ours / vLLM)", "ratio", "TPOT p50 ms", "ratio",
                  "TTFT p50 ms", "ratio"], rows)


# --- speculation ------------------------------------------------------------------------------------------

SPECULATION = "speculation_steady_rerun.json"


def _spec_row(d: dict, workload: str, batch: int) -> dict:
    return next(r for r in d["rows"] if r["workload"] == workload and r["batch"] == batch)


def spec_speedup(d: dict, workload: str, batch: int) -> str:
    r = _spec_row(d, workload, batch)
    return f"{times(r['speedup'])} ({min(r['speedups']):.2f}–{max(r['speedups']):.2f})"


def speculation_table(d: dict) -> str:
    rows = [[r["workload"], str(r["batch"]), f"{r['tok_per_s_off']:.1f}", f"{r['tok_per_s_on']:.1f}",
             f"{times(r['speedup'])} ({min(r['speedups']):.2f}–{max(r['speedups']):.2f})",
             f"{r['acceptance_rate']:.2f}", f"{r['mean_accepted_length']:.2f}"] for r in d["rows"]]
    return table(["workload", "batch", "off tok/s", "on tok/s", "speed-up, median (range)", "acceptance",
                  "mean accepted length"], rows)


SPECULATION_K1 = "speculation_steady_k1.json"
SPECULATION_K1_NGRAM1 = "speculation_steady_k1_ngram1.json"   # one-token n-gram matches
SPECULATION_XEON = "speculation_steady_k1_ngram1_xeon.json"    # the same on the Intel host, its own profile
SPECULATION_XEON5 = "speculation_steady_k1_ngram1_xeon_r5.json"   # again there, 5 repeats, batches up to 48


def _spread(values: list) -> str:
    return "–".join("∞" if v == "inf" else f"{v:.1f}" for v in values)


def break_even_table(d: dict) -> str:
    """Measured crossing of 1 (median over repeats, per-repeat min–max) against the batch the operator's
    costs price it at, at the run's measured acceptance and draft share."""
    rows = [[r["workload"], str(r["k"]), f"{r['acceptance_rate']:.2f}", f"{r['draft_share']:.2f}",
             _spread([r["measured_break_even"]]), _spread(r["measured_spread"]), f"{r['predicted_profile']:.1f}",
             f"{r['predicted_roofline']:.1f}"] for r in d["break_even"]]
    return table(["workload", "k", "acceptance", "draft share", "measured break-even", "per-repeat range",
                  "profile prices", "roofline prices"], rows)


def priced_by_batch_table(d: dict) -> str:
    """Per batch: the measured speed-up (median, range) and the profile's price of what speculation did."""
    rows = [[e["workload"], str(e["batch"]), f"{e['measured']:.2f} ({e['measured_range'][0]:.2f}–"
             f"{e['measured_range'][1]:.2f})", f"{e['predicted_profile']:.2f}",
             "yes" if e["measured_range"][0] <= e["predicted_profile"] <= e["measured_range"][1] else "no"]
            for e in d["speedup_by_batch"]]
    return table(["workload", "batch", "measured", "profile prices", "in range"], rows)


def priced_summary(d: dict) -> str:
    """Per cost and workload: the share of batches priced inside the measured range (and the share a price
    without error would be, where the run recorded its repeats), and the median error."""
    def chance(v: dict) -> str:
        return f" (a price without error: {v['chance_in_range']:.0%})" if v.get("chance_in_range") else ""

    return "; ".join(f"{key.replace('/', ', ')}: {v['in_range']:.0%} of the batches in range{chance(v)}, median "
                     f"error {v['median_abs_error']:.1%}" for key, v in d["speedup_by_batch_summary"].items())


def repriced_line(d: dict) -> str:
    again = d["predicted_again"]
    return (f"Priced by `{again['command']}` at commit `{again['commit']}` ({again['date']}), from the "
            f"measurements of `{provenance(d)['command'] or d['args']['json']}`.")


# --- operator ---------------------------------------------------------------------------------------------

SCALE_5000 = "operator_scale_5000.json"
SCALE_5000_PACED, SCALE_5000_PACED_BASE = "operator_scale_5000_paced.json", "operator_scale_5000_paced_base.json"
SCALE_ENGINE, SCALE_ENGINE_BASE = "operator_scale_1000_engine_series.json", "operator_scale_1000_engine_series_base.json"
SCALE_5000_ENGINE = "operator_scale_5000_engine_series.json"
STEP_SUMMARY, STEP_SUMMARY_BASE = "operator_scale_1000_step_summary.json", "operator_scale_1000_step_summary_base.json"
DIGESTS, DIGESTS_BASE = "operator_scale_1000_digests.json", "operator_scale_1000_digests_base.json"
THREADS, THREADS_BASE = "operator_scale_5000_threads.json", "operator_scale_5000_threads_base.json"
BUSY = "operator_scale_5000_busy.json"
ONE_CORE, ONE_CORE_BASE = "operator_scale_5000_one_core.json", "operator_scale_5000_one_core_base.json"
SCALE_5000_XEON = "operator_scale_5000_xeon.json"
SCALE_ROWS = [("all reconciled", "all_reconciled_seconds", 1, " s"), ("SLO edit p50", "edit_latency_p50_s", 3, " s"),
              ("SLO edit p99", "edit_latency_p99_s", 3, " s"),
              ("operator RSS peak", "operator_rss_peak_mib", 0, " MiB"),
              ("operator CPU, fleet idle", "operator_idle_cpu_percent", 1, "%"),
              ("operator CPU, burst", "operator_burst_cpu_percent", 1, "%"),
              ("emulator CPU, fleet idle", "emulator_idle_cpu_percent", 1, "%"),
              ("Prometheus CPU, fleet idle", "prometheus_idle_cpu_percent", 1, "%"),
              ("Prometheus queries per control interval", "prometheus_queries_per_interval", 1, ""),
              ("services whose loop read Prometheus", "services_on_source", 0, "")]


def scale_table(d: dict, fleet: str = "fleet idle") -> str:
    """`fleet`: what the fleet did in the window after the edits ("fleet busy" with `--stub busy`)."""
    rows = [[name.replace("fleet idle", fleet), spread(d["summary"][key], digits, unit),
             ", ".join(f"{r[key]:.{digits}f}" for r in d["runs"])] for name, key, digits, unit in SCALE_ROWS]
    return table(["figure", "median (min–max)", "per run"], rows)


def busy_table(d: dict) -> str:
    return scale_table(d, "fleet busy")


def edit_p99_spread(d: dict) -> str:
    return spread(d["summary"]["edit_latency_p99_s"], 3, " s")


def edits_observed(d: dict) -> str:
    """How many of the runs' SLO edits were observed within the benchmark's 30 s, of how many made."""
    return f"{sum(r['edits_observed'] for r in d['runs'])} of {d['edits'] * len(d['runs'])}"


FAILOVER = "operator_failover.json"


def failover_table(d: dict) -> str:
    rows = [[f"`{how}`" if how.startswith("kill") else how, spread(s["takeover_s"], 2, " s"), str(s["edits"]),
             str(s["edits_lost"]), str(s["deployment_writes"]), str(s["duplicate_actions"])]
            for how, s in d["summary"].items()]
    return table(["leader stopped by", "takeover, median (min–max)", "edits", "lost", "Deployment writes",
                  "duplicate actions"], rows)


APISERVER = "apiserver.json"


def apiserver_table(d: dict) -> str:
    rows = [[p["op"], str(p["count"]), f"{p['per_second']:.0f}", f"{p['p50_ms']:.0f}", f"{p['p99_ms']:.0f}"]
            for p in d["phases"]]
    return table(["operation", "count", "per second", "p50 ms", "p99 ms"], rows)


# --- control loop (simulator) -----------------------------------------------------------------------------

CONTROL = "control.json"


def control_table(d: dict) -> str:
    rows = [[g["scenario"], g["policy"], f"{g['slo_attainment']:.3f}", f"{g['gpu_hours']:.2f}",
             str(g["scaling_actions"]), str(g["speculation_switches"])] for g in d["grid"]]
    return table(["scenario", "policy", "SLO attainment", "GPU-h", "scaling actions", "speculation switches"], rows)


SWEEP_LABELS = {"specfleet": "auto", "spec-always-on": "always on", "spec-always-off": "always off"}


def speculation_sweep_table(d: dict) -> str:
    """The speculation sweep per load: auto, always on, always off (median over seeds [spread when not 0])."""
    def spread(value: float, width: float, fmt: str) -> str:
        return f"{value:{fmt}}" + (f" [{width:{fmt}}]" if width else "")

    rows, last = [], None
    for r in (r for r in d["speculation_sweep"] if r["policy"] in SWEEP_LABELS):
        load = f"{r['load']:g}" if r["load"] != last else ""
        last = r["load"]
        reason = ", ".join(r["speculation_reasons"]) if r["policy"] == "specfleet" else ""
        rows.append([load, SWEEP_LABELS[r["policy"]], f"{r['batch_p50']:.0f}",
                     spread(r["slo_attainment"], r["slo_attainment_spread"], ".3f"),
                     spread(r["goodput"], r["goodput_spread"], ".0f"), f"{r['speculation_switches']:g}", reason])
    return table(["load (× 60 req/s)", "policy", "batch / replica", "SLO attainment", "goodput (tok/s)", "switches",
                  "last reason"], rows)


# --- closed loop and sim-to-real ------------------------------------------------------------------------

CLOSED_LOOP = "closed_loop_full.json"
SIM_PROFILE = "sim_to_real_full_profile.json"


def _goodput(run: dict, phase: str | None) -> str:
    if phase is None:
        return f"{run['overall']['goodput_tok_s']:.1f}"
    lo, hi = run["spread"][phase]["goodput_tok_s"]
    return f"{run['phases'][phase]['goodput_tok_s']:.1f} [{lo:.1f}–{hi:.1f}]"


def closed_loop_table(d: dict) -> str:
    runs, auto = d["runs"], d["runs"]["auto"]
    rows = [[phase, *(_goodput(runs[m], phase) for m in ("auto", "on", "off")),
             f"{auto['phases'][phase]['batch_mean']:.1f}", f"{auto['phases'][phase]['speculation_on_share']:.2f}"]
            for phase in auto["phases"]]
    rows.append(["overall", *(_goodput(runs[m], None) for m in ("auto", "on", "off")),
                 f"{auto['overall']['batch_mean']:.1f}", f"{auto['overall']['speculation_on_share']:.2f}"])
    return table(["phase", "auto", "always on", "always off", "batch (auto)", "spec on (auto)"], rows)


def sim_within(d: dict) -> str:
    return f"{d['within_share']:.1%}"


CONTENTION, SIM_CONTENTION = "contention_xeon.json", "sim_to_real_full_contention.json"


def contention_table(d: dict) -> str:
    f = d["factors"]
    counts = sorted({int(c) for v in f.values() for c in v})

    def cell(state: str, c: int) -> str:
        x = f.get(state, {}).get(str(c))
        if x is None:
            return "-"
        lo, hi = x.get("step_factor_range") or (x["step_factor"],) * 2
        return f"{x['step_factor']:.2f}" + (f" [{lo:.2f}–{hi:.2f}]" if f"{lo:.2f}" != f"{hi:.2f}" else "")
    return table(["clients", "slowdown, speculation off [range]", "slowdown, speculation on [range]"],
                 [[str(c), cell("off", c), cell("on", c)] for c in counts])


CONTENTION_TTFT, SIM_CONTENTION_TTFT = "contention_xeon_ttft.json", "sim_to_real_full_contention_ttft.json"
SIM_PROFILE_ACCEPTANCE = "sim_to_real_full_contention_profile_acceptance.json"   # the aligned wait alone


def ttft_table(d: dict) -> str:
    """Per phase and speculation state, medians over the repeats: the engine's step, the mean time to first
    token as the engine timed it and as the clients saw it, and the engine's in steps."""
    def median(state: str, phase: str, key: str) -> float | None:
        values = [r["phases"][phase].get(key) for r in d["runs"][state]]
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    rows = []
    for state, runs in d["runs"].items():
        for phase in runs[0]["phases"]:
            step, engine, client = (median(state, phase, key) for key in
                                    ("measured_step_ms", "ttft_engine_ms", "ttft_client_ms"))
            if None in (step, engine, client):
                continue
            rows.append([state, phase, f"{step:.0f}", f"{engine:.0f}", f"{client:.0f}", f"{client - engine:.0f}",
                         f"{engine / step:.1f}"])
    return table(["speculation", "phase", "step (ms)", "TTFT, engine (ms)", "TTFT, clients (ms)",
                  "clients - engine (ms)", "engine TTFT in steps"], rows)


def sim_within_by_phase(d: dict) -> str:
    return ", ".join(f"{phase} {share:.0%}" for phase, share in d["within_by_phase"].items())


def sim_p50_within(d: dict) -> str:
    m = d["within_by_metric"]
    return f"TTFT p50 {m['ttft_p50_ms']:.0%}, ITL p50 {m['itl_p50_ms']:.0%}"


def closed_loop_checks(d: dict) -> str:
    """Per phase: auto against the better fixed policy, and whether it is within the 3% the check allows."""
    per_phase = d["checks"]["goodput"]["per_phase"]
    rows = [[phase, f"{c['auto']:.1f}", f"{c['best_fixed']:.1f} ({c['best_mode']})",
             f"{c['auto'] / c['best_fixed'] - 1:+.1%}", "yes" if c["ok"] else "no"] for phase, c in per_phase.items()]
    overall, ok = d["checks"]["goodput"]["overall"], d["checks"]["goodput"]["overall_ok"]
    best = max(("on", "off"), key=lambda m: overall[m])
    rows.append(["overall", f"{overall['auto']:.1f}", f"{overall[best]:.1f} ({best})",
                 f"{overall['auto'] / overall[best] - 1:+.1%}", "yes" if ok else "no"])
    return table(["phase", "auto", "better fixed policy", "auto against it", "check"], rows)


def closed_loop_switches(d: dict) -> str:
    """Per repeat of auto: on/off switches by reason, depth retunes, crossings due a switch and the verdict."""
    auto = d["runs"]["auto"]
    rows = []
    for i, (switches, check) in enumerate(zip(auto["switches_per_repeat"], auto["switch_checks_per_repeat"]), 1):
        toggles = [s for s in switches if s["reason"] != "DepthRetuned"]
        named = ", ".join(f"{'on' if s['enabled'] else 'off'} {s['reason']} at batch {s['batch']:.1f} "
                          f"(threshold {s['threshold']})" for s in toggles) or "none"
        rows.append([str(i), named, str(check["depth_retunes"]), str(check["due_crossings"]), check["verdict"]])
    return table(["repeat", "on/off switches", "depth retunes", "crossings due a switch", "verdict"], rows)


# --- multi-LoRA -------------------------------------------------------------------------------------------

LORA = "lora.json"
LORA_CPU = "lora_cpu.json"


def lora_cpu_op(d: dict) -> str:
    """The LoRA op's time per decode step, torch against the C++ extension (median [min–max] ms)."""
    torch_op, ext = d["rows"]
    return (f"{torch_op['median_ms']:.1f} ms [{torch_op['min_ms']:.1f}–{torch_op['max_ms']:.1f}] to "
            f"{ext['median_ms']:.1f} ms [{ext['min_ms']:.1f}–{ext['max_ms']:.1f}], {times(d['speedup'])}")


LORA_METRICS = {"output_throughput": ("output tok/s", 1), "ttft_p50": ("TTFT p50 (ms)", 0),
                "ttft_p99": ("TTFT p99 (ms)", 0), "tpot_p50": ("TPOT p50 (ms)", 0), "tpot_p99": ("TPOT p99 (ms)", 0)}


def lora_table(d: dict) -> str:
    def cell(s: dict, digits: int) -> str:
        f = f"{{:.{digits}f}}"
        return f"{f.format(s['median'])} [{f.format(s['min'])}-{f.format(s['max'])}]"
    rows = [[name, cell(d["cells"]["base"][key], digits), cell(d["cells"]["lora"][key], digits),
             f"{d['lora/base'][key]:.2f}"] for key, (name, digits) in LORA_METRICS.items()]
    return table(["metric", "base", "lora", "lora/base"], rows)


def lora_setup(d: dict) -> str:
    c = d["config"]
    return (f"{c['repeats']} runs per mode, {c['prompts_per_slot'] * c['concurrency']} timed requests of "
            f"{c['random_input_len']} prompt and {c['random_output_len']} output tokens per run, concurrency "
            f"{c['concurrency']}, {c['adapters']} adapters of rank {c['rank']}")


# --- GPU speculation: published against priced -------------------------------------------------------------

PUBLISHED = "published_speculation.json"


def published_table(series_id: str) -> Callable[[dict], str]:
    def render(d: dict) -> str:
        s = next(x for x in d["series"] if x["id"] == series_id)
        rows = s["rows"]
        ks = {r["k"] for r in rows}
        header = ["batch"] + [str(r["batch"]) if len(ks) == 1 else f"{r['batch']} (k={r['k']})" for r in rows]
        return table(header, [[name] + [f"{r[name]:.2f}" for r in rows]
                              for name in ("published", "roofline", "former")])
    return render


# --- the registry -----------------------------------------------------------------------------------------

FIGURES: dict[str, Figure] = {f.id: f for f in [
    Figure("engine.vs_transformers", ENGINE, lambda d: times(d["ratios"]["transformers_static16"])),
    Figure("engine.vs_vllm", ENGINE, lambda d: times(d["ratios"]["vllm_cpu"])),
    Figure("engine.table", ENGINE, engine_table),
    Figure("engine.provenance", ENGINE, provenance_line),
    Figure("serving.bf16.throughput", SERVING_BF16, lambda d: span(_ratios(d, "output_throughput")) + "×"),
    Figure("serving.bf16.tpot_p50", SERVING_BF16, lambda d: span(_ratios(d, "tpot_p50")) + "×"),
    Figure("serving.bf16.ttft_p50", SERVING_BF16, lambda d: span(_ratios(d, "ttft_p50")) + "×"),
    Figure("serving.bf16.table", SERVING_BF16, serving_table),
    Figure("serving.bf16.provenance", SERVING_BF16, provenance_line),
    Figure("serving.fp32.throughput", SERVING_FP32, lambda d: span(_ratios(d, "output_throughput")) + "×"),
    Figure("serving.fp32.table", SERVING_FP32, serving_table),
    Figure("serving.fp32.provenance", SERVING_FP32, provenance_line),
    Figure("speculation.copy_b1", SPECULATION, lambda d: spec_speedup(d, "copy-heavy", 1)),
    Figure("speculation.table", SPECULATION, speculation_table),
    Figure("speculation.provenance", SPECULATION, provenance_line),
    Figure("speculation.break_even", SPECULATION, break_even_table),
    Figure("speculation.priced", SPECULATION, priced_by_batch_table),
    Figure("speculation.repriced", SPECULATION, repriced_line),
    Figure("speculation_k1.break_even", SPECULATION_K1, break_even_table),
    Figure("speculation_k1.priced", SPECULATION_K1, priced_by_batch_table),
    Figure("speculation_k1.repriced", SPECULATION_K1, repriced_line),
    Figure("speculation_k1_ngram1.break_even", SPECULATION_K1_NGRAM1, break_even_table),
    Figure("speculation_k1_ngram1.priced", SPECULATION_K1_NGRAM1, priced_by_batch_table),
    Figure("speculation_k1_ngram1.provenance", SPECULATION_K1_NGRAM1, provenance_line),
    Figure("speculation_k1_ngram1.summary", SPECULATION_K1_NGRAM1, priced_summary),
    Figure("speculation_xeon.break_even", SPECULATION_XEON, break_even_table),
    Figure("speculation_xeon.priced", SPECULATION_XEON, priced_by_batch_table),
    Figure("speculation_xeon.provenance", SPECULATION_XEON, provenance_line),
    Figure("speculation_xeon.repriced", SPECULATION_XEON, repriced_line),
    Figure("speculation_xeon.summary", SPECULATION_XEON, priced_summary),
    Figure("speculation_xeon5.break_even", SPECULATION_XEON5, break_even_table),
    Figure("speculation_xeon5.priced", SPECULATION_XEON5, priced_by_batch_table),
    Figure("speculation_xeon5.provenance", SPECULATION_XEON5, provenance_line),
    Figure("speculation_xeon5.repriced", SPECULATION_XEON5, repriced_line),
    Figure("speculation_xeon5.summary", SPECULATION_XEON5, priced_summary),
    Figure("operator.scale_5000", SCALE_5000, scale_table),
    Figure("operator.scale_5000.provenance", SCALE_5000, provenance_line),
    Figure("operator.scale_5000_paced", SCALE_5000_PACED, scale_table),
    Figure("operator.scale_5000_paced.provenance", SCALE_5000_PACED, provenance_line),
    Figure("operator.scale_5000_paced_base.provenance", SCALE_5000_PACED_BASE, provenance_line),
    Figure("operator.scale_5000_engine_series", SCALE_5000_ENGINE, scale_table),
    Figure("operator.scale_5000_engine_series.provenance", SCALE_5000_ENGINE, provenance_line),
    Figure("operator.step_summary", STEP_SUMMARY, scale_table),
    Figure("operator.step_summary.provenance", STEP_SUMMARY, provenance_line),
    Figure("operator.step_summary_base", STEP_SUMMARY_BASE, scale_table),
    Figure("operator.step_summary_base.provenance", STEP_SUMMARY_BASE, provenance_line),
    Figure("operator.digests", DIGESTS, scale_table),
    Figure("operator.digests.provenance", DIGESTS, provenance_line),
    Figure("operator.digests_base", DIGESTS_BASE, scale_table),
    Figure("operator.digests_base.provenance", DIGESTS_BASE, provenance_line),
    Figure("operator.threads.provenance", THREADS, provenance_line),
    Figure("operator.threads_base.provenance", THREADS_BASE, provenance_line),
    Figure("operator.threads.edit_p99", THREADS, edit_p99_spread),
    Figure("operator.threads_base.edit_p99", THREADS_BASE, edit_p99_spread),
    Figure("operator.one_core", ONE_CORE, scale_table),
    Figure("operator.one_core.provenance", ONE_CORE, provenance_line),
    Figure("operator.one_core.edits_observed", ONE_CORE, edits_observed),
    Figure("operator.one_core_base", ONE_CORE_BASE, scale_table),
    Figure("operator.one_core_base.provenance", ONE_CORE_BASE, provenance_line),
    Figure("operator.one_core_base.edits_observed", ONE_CORE_BASE, edits_observed),
    Figure("operator.scale_5000_xeon", SCALE_5000_XEON, scale_table),
    Figure("operator.scale_5000_xeon.provenance", SCALE_5000_XEON, provenance_line),
    Figure("operator.busy", BUSY, busy_table),
    Figure("operator.busy.provenance", BUSY, provenance_line),
    Figure("operator.scale_engine_series", SCALE_ENGINE, scale_table),
    Figure("operator.scale_engine_series.provenance", SCALE_ENGINE, provenance_line),
    Figure("operator.scale_engine_series_base", SCALE_ENGINE_BASE, scale_table),
    Figure("operator.scale_engine_series_base.provenance", SCALE_ENGINE_BASE, provenance_line),
    Figure("operator.failover", FAILOVER, failover_table),
    Figure("operator.failover.provenance", FAILOVER, provenance_line),
    Figure("apiserver.table", APISERVER, apiserver_table),
    Figure("apiserver.provenance", APISERVER, provenance_line),
    Figure("control.grid", CONTROL, control_table),
    Figure("control.speculation_sweep", CONTROL, speculation_sweep_table),
    Figure("closed_loop.table", CLOSED_LOOP, closed_loop_table),
    Figure("closed_loop.provenance", CLOSED_LOOP, provenance_line),
    Figure("closed_loop.checks", CLOSED_LOOP, closed_loop_checks),
    Figure("closed_loop.switches", CLOSED_LOOP, closed_loop_switches),
    Figure("sim_to_real.profile.within", SIM_PROFILE, sim_within),
    Figure("sim_to_real.profile.by_phase", SIM_PROFILE, sim_within_by_phase),
    Figure("sim_to_real.profile.provenance", SIM_PROFILE, provenance_line),
    Figure("sim_to_real.contention.within", SIM_CONTENTION, sim_within),
    Figure("sim_to_real.contention.by_phase", SIM_CONTENTION, sim_within_by_phase),
    Figure("sim_to_real.contention.provenance", SIM_CONTENTION, provenance_line),
    Figure("contention.table", CONTENTION, contention_table),
    Figure("contention.provenance", CONTENTION, provenance_line),
    Figure("contention_ttft.table", CONTENTION_TTFT, contention_table),
    Figure("contention_ttft.ttft", CONTENTION_TTFT, ttft_table),
    Figure("contention_ttft.provenance", CONTENTION_TTFT, provenance_line),
    Figure("sim_to_real.contention_ttft.within", SIM_CONTENTION_TTFT, sim_within),
    Figure("sim_to_real.contention_ttft.by_phase", SIM_CONTENTION_TTFT, sim_within_by_phase),
    Figure("sim_to_real.contention_ttft.provenance", SIM_CONTENTION_TTFT, provenance_line),
    Figure("sim_to_real.profile_acceptance.within", SIM_PROFILE_ACCEPTANCE, sim_within),
    Figure("sim_to_real.profile_acceptance.p50", SIM_PROFILE_ACCEPTANCE, sim_p50_within),
    Figure("sim_to_real.profile_acceptance.provenance", SIM_PROFILE_ACCEPTANCE, provenance_line),
    Figure("control.provenance", CONTROL, provenance_line),
    Figure("lora.table", LORA, lora_table),
    Figure("lora.ratio", LORA, lambda d: f"{d['lora/base']['output_throughput']:.3f}×"),
    Figure("lora.cpu_op", LORA_CPU, lora_cpu_op),
    Figure("lora.cpu_op.provenance", LORA_CPU, provenance_line),
    Figure("lora.setup", LORA, lora_setup),
    Figure("lora.provenance", LORA, provenance_line),
    Figure("speculation_gpu.provenance", PUBLISHED, provenance_line),
    *(Figure(f"speculation_gpu.{series}", PUBLISHED, published_table(series)) for series in (
        "eagle3-sglang-h100-eagle3", "eagle3-sglang-h100-eagle", "eagle3-vllm-rtx3090-eagle3",
        "eagle3-vllm-rtx3090-eagle", "magicdec-a100x8-self-llama-3.1-8b-32k", "magicdec-h100x8-self-llama-3.1-8b-32k")),
]}
