"""The few-row linears of a SmolLM2 decode step: this tree's output panels against an earlier commit's
`linear_small` and against oneDNN, per layer shape and in whole decode steps.

1. Kernels. For each SmolLM2 linear shape and row count, one call per layer over 30 distinct weights
   (one LM head), so each weight comes from memory as in a step: oneDNN's packed GEMM, `--against`'s
   `linear_small` over the plain weight (built from its sources beside this tree's, this tree's flags),
   and this tree's `linear_panels`. `--rounds` rounds alternate the order; the table gives the median
   and range of the rounds, the weight bytes streamed per second, and this tree / each per round.
2. Steps (`--batches`). Whole decode steps (`LLMEngine.step`, greedy, 256-token prompts) in two modes,
   interleaved two steps at a time in one process: `against` runs every few-row linear on `--against`'s
   `linear_small` up to the row limits that commit keeps for this machine (measured once, as it would,
   if its file is missing), `this tree` on the panels up to this tree's. Attention and the elementwise
   steps are this tree's in both. Each repeat is a fresh process; the table gives the median step over
   repeats with the min-max of the per-repeat medians, and this tree / against per repeat.

    .venv/bin/python benchmarks/linear_panels.py --against 1c1182b [--dtype bfloat16] [--rows 1 8 32]
        [--rounds 7] [--batches 1 8 32] [--repeats 3] [--steps 40] [--json benchmarks/results/linear_panels.json]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parent.parent
LINEARS = {"qkv 576->960": (576, 960), "o 576->576": (576, 576), "gate_up 576->3072": (576, 3072),
           "down 1536->576": (1536, 576), "lm_head 576->49152": (576, 49152)}
LAYERS = 30
MODES = ("against", "this tree")


def against_kernel(commit: str):
    from cpu_decode_ops import build_against        # benchmarks/cpu_decode_ops.py
    from specfleet.engine.cpu.attention import CFLAGS

    return build_against(commit, CFLAGS, ("linear_small.cpp",), ["linear_small"])


def plain_weight(linear) -> "torch.Tensor":
    """W [out, in] back from a PackedLinear's panels [count, units, 48, unit]."""
    count, units, width, unit = linear.panels.shape
    full = linear.panels.transpose(1, 2).reshape(count * width, units * unit)
    return full[:linear.out_features, :linear.in_features].contiguous()


def kernels(args) -> list[dict]:
    import torch
    from torch import nn

    from cpu_backend import alternating_rounds      # benchmarks/cpu_backend.py
    from specfleet.engine.cpu.attention import load_kernel
    from specfleet.engine.cpu.linear import PackedLinear

    current, against, dtype, out = load_kernel(), against_kernel(args.against), getattr(torch, args.dtype), []
    torch.manual_seed(0)
    with torch.inference_mode():
        for name, (k, n) in LINEARS.items():
            layers = [PackedLinear(nn.Linear(k, n, bias=False).to(dtype), current)
                      for _ in range(1 if "lm_head" in name else LAYERS)]
            if layers[0].panels is None:
                raise SystemExit(f"no panel kernel on this CPU for {args.dtype}")
            plain = [plain_weight(layer) for layer in layers]
            streamed = len(layers) * k * n * dtype.itemsize
            for rows in args.rows:
                x = torch.randn(rows, k).to(dtype)
                calls = {"oneDNN": lambda: [layer.gemm(x) for layer in layers],
                         "against": lambda: [against.linear_small(x, w, None) for w in plain],
                         "this tree": lambda: [layer.small(x) for layer in layers]}
                times = alternating_rounds(calls, args.rounds, reps=5, warmups=2)
                out.append({"linear": name, "rows": rows, "ms": times, "bytes": streamed} |
                           {f"this/{other}": [a / b for a, b in zip(times["this tree"], times[other])]
                            for other in ("oneDNN", "against")})
    return out


def against_limits(model, commit: str) -> None:
    """Sets every PackedLinear's limit to what `commit`'s kernel keeps for this machine (its RowLimitStore file,
    measured and written as that commit would if it is missing)."""
    import torch

    from specfleet.engine.builtin import cache_root
    from specfleet.engine.cpu.attention import cpu_tag
    from specfleet.engine.cpu.linear import calibrate_small_rows
    from specfleet.engine.cpu.row_limits import RowLimitStore

    def show(path: str) -> str:
        return subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout

    source = show("engine/cpu/linear_small.cpp") + show("engine/cpu/vec_math.h")
    tag = hashlib.sha1(source.encode()).hexdigest()[:8]
    calibrate_small_rows(model, RowLimitStore(cache_root() / "row-limits" / f"torch{torch.__version__}-{cpu_tag()}-{tag}.json"))


def child(commit: str, batch: int, steps: int, dtype: str) -> None:
    """One repeat in this process: prints {mode: median step ms, "limits": {mode: {shape: rows}}}."""
    from cpu_decode_ops import interleaved_steps    # benchmarks/cpu_decode_ops.py
    from specfleet.engine.builtin import ensure_builtin
    from specfleet.engine.config import EngineConfig
    from specfleet.engine.cpu.linear import PackedLinear
    from specfleet.engine.engine import LLMEngine
    from specfleet.engine.server.serve import load_off_the_main_thread

    config = EngineConfig(model=str(ensure_builtin("smollm2-135m")), dtype=dtype, num_kv_blocks=64 * batch + 64)
    engine, against = load_off_the_main_thread(lambda: (LLMEngine(config), against_kernel(commit)))
    linears = [m for m in engine.runner.model.modules() if isinstance(m, PackedLinear)]
    settings = {"this tree": [(m.kernel, m.panels, None, m.small_rows) for m in linears]}
    for m in linears:
        m.kernel, m.weight, m.panels = against, plain_weight(m), None
    against_limits(engine.runner.model, commit)
    settings["against"] = [(m.kernel, m.panels, m.weight, m.small_rows) for m in linears]

    def use(mode: str) -> None:
        for m, (kernel, panels, weight, limit) in zip(linears, settings[mode]):
            m.kernel, m.panels, m.weight, m.small_rows = kernel, panels, weight, limit

    times = interleaved_steps(engine, batch, steps, MODES, use)
    limits = {mode: {f"{m.in_features}->{m.out_features}": s[3] for m, s in zip(linears, settings[mode])}
              for mode in MODES}
    print(json.dumps({mode: statistics.median(t) for mode, t in times.items()} | {"limits": limits}))


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", required=True, help="commit whose linear_small is the baseline")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batches", type=int, nargs="*", default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40, help="steps per mode and repeat")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=RESULTS / "linear_panels.json")
    parser.add_argument("--child", nargs=2, metavar=("COMMIT", "BATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    if args.child:
        child(args.child[0], int(args.child[1]), args.steps, args.dtype)
        return
    from rich.console import Console
    from rich.progress import track
    from rich.table import Table

    console = Console(width=max(Console().width, 150))
    rows = kernels(args)
    table = Table(title=f"SmolLM2 linears, {args.dtype}, weights from memory: ms per {LAYERS} layers "
                        f"(LM head: 1), median (min-max) of {args.rounds} rounds")
    for column in ("linear", "rows", "oneDNN", f"against ({args.against})", "this tree", "this tree GB/s",
                   "this / oneDNN", "this / against"):
        table.add_column(column)
    for row in rows:
        ms = row["ms"]
        table.add_row(row["linear"], str(row["rows"]), *(spread(ms[m]) for m in ("oneDNN", "against", "this tree")),
                      f"{row['bytes'] / statistics.median(ms['this tree']) / 1e6:.1f}",
                      spread(row["this/oneDNN"]), spread(row["this/against"]))
    console.print(table)

    runs: dict[int, list[dict]] = {batch: [] for batch in args.batches}
    jobs = [(repeat, batch) for repeat in range(args.repeats) for batch in args.batches]
    for repeat, batch in track(jobs, description="decode steps", console=console):
        command = [sys.executable, __file__, "--against", args.against, "--child", args.against, str(batch),
                   "--steps", str(args.steps),
                   "--dtype", args.dtype, "--threads", str(args.threads)]
        done = subprocess.run(command, capture_output=True, text=True, check=True, cwd="/")
        runs[batch].append(json.loads(done.stdout.strip().splitlines()[-1]))
    steps = Table(title=f"SmolLM2 decode step ms, {args.dtype}, 256-token prompts: median (min-max) over "
                        f"{args.repeats} repeats")
    for column in ("batch", *MODES, "this tree / against per repeat"):
        steps.add_column(column)
    summary = {}
    for batch, repeats in runs.items():
        summary[batch] = {mode: [r[mode] for r in repeats] for mode in MODES}
        ratios = [r["this tree"] / r["against"] for r in repeats]
        summary[batch]["ratios"] = ratios
        steps.add_row(str(batch), *(spread(summary[batch][m]) for m in MODES), spread(ratios))
    if runs:
        console.print(steps)
        console.print(f"row limits, first repeat: {runs[args.batches[0]][0]['limits']}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    report = {"config": vars(args) | {"json": str(args.json)}, "kernels": rows, "steps": summary, "runs": runs}
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
