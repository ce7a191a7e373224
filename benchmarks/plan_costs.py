"""The plan of SmolLM2-135M on the cpu entry from the roofline and from the measured profile, against
what the engine measured.

No engine runs here: it plans `manifests/examples/smollm2-cpu.yaml` twice (the cpu catalogue entry's
roofline; the shipped profile `operator/catalogs/profiles/smollm2-135m--cpu.json`) and prices the
served configuration of `benchmarks/results/serving_kernels.json` (32 closed-loop clients, 256
prompt / 128 output tokens) with each cost: every request's prompt is prefilled once, its tokens riding
in the batch's steps, and each output token is one decode step at batch 32. Compared with that run's
TPOT p50 and output throughput (median and spread over its repeats). Writes
benchmarks/results/plan_costs.json.

    python benchmarks/plan_costs.py
"""
from __future__ import annotations

import json
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks/results"
EXAMPLE = ROOT / "manifests/examples/smollm2-cpu.yaml"
SERVED = RESULTS / "serving_kernels.json"
BATCH, PROMPT, OUTPUT = 32, 256, 128


def priced(cost, batch: int = BATCH, prompt: int = PROMPT, output: int = OUTPUT) -> dict:
    """Decode step, TPOT and output tokens/s of `batch` closed-loop clients under `cost`."""
    ctx = prompt + output // 2
    decode = cost.step(batch, ctx)
    prefill = cost.mixed(batch, ctx, batch + batch * prompt) - decode
    cycle = output * decode + prefill
    return {"decode_step_ms": decode * 1000, "tpot_ms": cycle / output * 1000,
            "output_tokens_per_s": batch * output / cycle}


def plans() -> dict:
    from specfleet.operator import api, capacity, catalogs, planner, status

    spec = api.parse_spec(yaml.safe_load(EXAMPLE.read_text())["spec"])
    out = {}
    for name, profiles in (("roofline", catalogs.NO_PROFILES), ("profile", catalogs.profiles())):
        plan = planner.plan(spec, catalogs.gpus(), catalogs.models(), profiles)
        model = capacity.service_model(spec, plan, catalogs.gpus(), catalogs.models())
        out[name] = {"calibration": status.calibration_dict(plan.calibration), "plan": status.plan_dict(plan),
                     "replicas": plan.replicas, "per_replica_rps": model.replica_rps(capacity.TARGET_UTILIZATION),
                     "at_32_clients": priced(model.cost)}
    return out


def measured() -> dict:
    cell = json.loads(SERVED.read_text())["cells"][f"completions@{BATCH}"]["specfleet"]
    return {key: cell[key] for key in ("tpot_p50", "itl_p50", "output_throughput")}


def main() -> None:
    from rich.console import Console
    from rich.table import Table

    result = {"plans": plans(), "measured": measured(), "served": {"batch": BATCH, "prompt": PROMPT, "output": OUTPUT}}
    m = result["measured"]
    table = Table(title="SmolLM2-135M on the cpu entry: roofline vs measured profile vs the engine")
    for col in ("", "roofline", "profile", "measured (median, spread)"):
        table.add_column(col, justify="right")
    r, p = result["plans"]["roofline"], result["plans"]["profile"]
    span = lambda c: f"{c['median']:.0f} ({c['min']:.0f}-{c['max']:.0f})"  # noqa: E731
    rows = [("plan: ITL p99 (ms)", r["plan"]["predicted"]["itlP99Ms"], p["plan"]["predicted"]["itlP99Ms"], ""),
            ("plan: tokens/s per replica", r["plan"]["predicted"]["tokensPerSecondPerReplica"],
             p["plan"]["predicted"]["tokensPerSecondPerReplica"], ""),
            ("plan: maxNumSeqs", r["plan"]["maxNumSeqs"], p["plan"]["maxNumSeqs"], ""),
            ("plan: maxBatchForSpeculation", r["plan"]["predicted"]["maxBatchForSpeculation"],
             p["plan"]["predicted"]["maxBatchForSpeculation"], ""),
            ("plan: requests/s per replica", f"{r['per_replica_rps']:.2f}", f"{p['per_replica_rps']:.2f}", ""),
            ("32 clients: decode step (ms)", f"{r['at_32_clients']['decode_step_ms']:.0f}",
             f"{p['at_32_clients']['decode_step_ms']:.0f}", f"ITL p50 {span(m['itl_p50'])}"),
            ("32 clients: TPOT (ms)", f"{r['at_32_clients']['tpot_ms']:.0f}", f"{p['at_32_clients']['tpot_ms']:.0f}",
             span(m["tpot_p50"])),
            ("32 clients: output tok/s", f"{r['at_32_clients']['output_tokens_per_s']:.1f}",
             f"{p['at_32_clients']['output_tokens_per_s']:.1f}", span(m["output_throughput"]))]
    for row in rows:
        table.add_row(*[str(x) for x in row])
    Console(width=140).print(table)
    print(f"profile: {p['calibration']}")
    (RESULTS / "plan_costs.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
