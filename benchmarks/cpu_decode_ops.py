"""The CPU decode path on SmolLM2-135M: this tree's extension against an earlier commit's, one step at a time.

1. Single calls at one decode row of SmolLM2 (hot cache), median microseconds: the decoder's elementwise
   steps as torch ops (`TorchElementwise`), in `--against`'s extension and in this tree's; paged
   attention (256-token context) in both extensions; a linear's fixed cost (an 8x8 weight) through
   oneDNN, `F.linear` and `linear_small`.
   Linear layers of SmolLM2 (fp32, hot cache) at 1-32 rows: oneDNN-packed GEMM
   (`torch.ops.mkldnn._linear_pointwise`) vs the extension's `linear_small`, median microseconds. (Which
   one a served step takes is measured cold, over all its layers, when a model first loads on a machine,
   and kept in the cache for every later load (`engine/cpu/row_limits.py`): the steps' JSON records
   those row limits per shape.)
2. Whole decode steps (`LLMEngine.step`, greedy, 256-token prompts) at each batch, four modes in one
   process, interleaved two steps at a time so the machine's drift hits all of them:
   - `against`: the C++ extension (paged attention, fused elementwise steps) built from `--against`'s
     sources, every linear on the packed GEMM (what that commit ran);
   - `packed only`: this tree's extension, every linear on the packed GEMM;
   - `prior rule`: this tree's extension, `linear_small` up to `small_rows_limit`'s fixed rows (what
     d5a67da did: 8 rows, 4 for 1,536 inputs);
   - `this tree`: this tree's extension, `linear_small` up to the machine's row limits (measured by the first
     load, then read from the cache).
   Each repeat is a fresh process; the table gives the median step over repeats with the min-max of the
   per-repeat medians, and this tree / against.

    .venv/bin/python benchmarks/cpu_decode_ops.py [--against 6e173fe] [--batches 1 4 8] [--repeats 3]
        [--steps 60] [--engine-flags] [--dtype float32|bfloat16] [--json benchmarks/results/cpu_decode_ops.json]

`--against`'s sources are built with the flags the engine used up to 6e173fe, or with `--engine-flags`
with this tree's (for a baseline from after -fno-trapping-math came in).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parent.parent
LINEARS = {"qkv 576->960": (576, 960), "o 576->576": (576, 576), "gate_up 576->3072": (576, 3072),
           "down 1536->576": (1536, 576), "lm_head 576->49152": (576, 49152)}
MODES = ("against", "packed only", "prior rule", "this tree")
# the flags the baseline was built with up to 6e173fe (this tree adds -fno-trapping-math for vec_math.h)
AGAINST_CFLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno"]
OLD_FUNCTIONS = ["paged_attention_short", "rms_norm", "add_rms_norm", "silu_and_mul", "rotary"]


def median_us(fn, calls: int, repeats: int = 5) -> float:
    import time

    for _ in range(max(3, calls // 10)):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def linear_rows(rows_list: list[int]) -> list[dict]:
    import torch

    from specfleet.engine.cpu.attention import load_kernel
    kernel, out = load_kernel(), []
    with torch.inference_mode():
        for name, (k, n) in LINEARS.items():
            weight = torch.randn(n, k)
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
            for rows in rows_list:
                x = torch.randn(rows, k)
                calls = 20 if n > 10000 else 200
                onednn = median_us(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""), calls)
                small = median_us(lambda: kernel.linear_small(x, weight, None), calls)
                out.append({"linear": name, "rows": rows, "onednn_us": onednn, "small_us": small})
    return out


def single_calls(against) -> list[dict]:
    """One decode row: (op, implementation, median us)."""
    import torch
    import torch.nn.functional as F

    from specfleet.engine.cpu.attention import load_kernel
    from specfleet.engine.model.llama import TorchElementwise

    current, out = load_kernel(), []
    gen = torch.Generator().manual_seed(0)
    x, residual, weight = torch.randn(1, 576, generator=gen), torch.randn(1, 576, generator=gen), torch.randn(576)
    gate_up = torch.randn(1, 3072, generator=gen)
    q, k = torch.randn(1, 9, 64, generator=gen), torch.randn(1, 3, 64, generator=gen)
    cos, sin = torch.randn(1, 1, 64, generator=gen), torch.randn(1, 1, 64, generator=gen)
    k_cache, v_cache = torch.randn(32, 16, 3, 64, generator=gen), torch.randn(32, 16, 3, 64, generator=gen)
    table, context = torch.arange(16, dtype=torch.int32).view(1, 16), torch.tensor([256], dtype=torch.int32)
    w8, x8 = torch.randn(8, 8), torch.randn(1, 8)
    packed8 = torch.ops.mkldnn._reorder_linear_weight(w8, None)
    impls = {"torch ops": TorchElementwise, "against": against, "this tree": current}
    with torch.inference_mode():
        for name, ops in impls.items():
            out += [("rms_norm 576", name, median_us(lambda: ops.rms_norm(x, weight, 1e-5), 2000)),
                    ("add + rms_norm 576", name, median_us(lambda: ops.add_rms_norm(x, residual, weight, 1e-5), 2000)),
                    ("silu_and_mul 2x1536", name, median_us(lambda: ops.silu_and_mul(gate_up), 2000)),
                    ("rotary 9+3 heads of 64", name, median_us(lambda: ops.rotary(q, k, cos, sin), 2000))]
        for name in ("against", "this tree"):
            kernel = impls[name]
            out.append(("paged attention, ctx 256", name, median_us(
                lambda: kernel.paged_attention_short(q, k_cache, v_cache, table, context, 1, 0.125), 2000)))
        out += [("linear 8x8", "oneDNN packed",
                 median_us(lambda: torch.ops.mkldnn._linear_pointwise(x8, packed8, None, "none", [], ""), 2000)),
                ("linear 8x8", "F.linear", median_us(lambda: F.linear(x8, w8), 2000)),
                ("linear 8x8", "linear_small", median_us(lambda: current.linear_small(x8, w8, None), 2000))]
    return [{"op": op, "impl": impl, "us": us} for op, impl, us in out]


def build_against(commit: str, cflags: list[str] | None = None,
                  files: tuple[str, ...] = ("paged_attention.cpp", "fused_ops.cpp"), functions=OLD_FUNCTIONS):
    """The extension as `commit` had it: its `files` of engine/cpu (vec_math.h inlined if that commit has
    one) binding `functions`, built under its own name beside this tree's with `cflags` (AGAINST_CFLAGS)."""
    import hashlib

    from torch.utils.cpp_extension import load_inline

    from specfleet.engine.cpu.attention import inline_header, kernel_build_dir

    def show(path: str) -> str | None:
        done = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT, capture_output=True, text=True)
        return done.stdout if done.returncode == 0 else None

    header = show("engine/cpu/vec_math.h") or ""
    sources = [inline_header(show(f"engine/cpu/{name}"), header) for name in files]
    cflags = AGAINST_CFLAGS if cflags is None else cflags
    tag = hashlib.sha1("".join(sources + cflags + list(functions)).encode()).hexdigest()[:10]
    build_dir = kernel_build_dir().with_name(f"against-{tag}")
    build_dir.mkdir(parents=True, exist_ok=True)
    return load_inline(name=f"specfleet_cpu_against_{tag}", cpp_sources=sources, functions=list(functions),
                       build_directory=str(build_dir),
                       extra_cflags=cflags, extra_ldflags=["-fopenmp"])


def child(commit: str, batch: int, steps: int, cflags: list[str] | None, dtype: str = "float32") -> None:
    """One repeat in this process: prints {mode: median step ms, "limits": {shape: rows}}."""
    from specfleet.engine.builtin import ensure_builtin
    from specfleet.engine.config import EngineConfig
    from specfleet.engine.cpu.attention import load_kernel
    from specfleet.engine.cpu.linear import PackedLinear, small_rows_limit
    from specfleet.engine.engine import LLMEngine
    from specfleet.engine.server.serve import load_off_the_main_thread

    config = EngineConfig(model=str(ensure_builtin("smollm2-135m")), dtype=dtype, num_kv_blocks=64 * batch + 64)
    engine, against = load_off_the_main_thread(lambda: (LLMEngine(config), build_against(commit, cflags)))
    model, current = engine.runner.model, load_kernel()
    linears = [m for m in model.modules() if isinstance(m, PackedLinear)]
    measured = [linear.small_rows for linear in linears]

    def use(mode: str) -> None:
        ext = against if mode == "against" else current
        model.set_elementwise(ext)
        for layer in model.model.layers:
            layer.self_attn.attend.kernel = ext
        for linear, limit in zip(linears, measured):
            linear.kernel = current if mode in ("prior rule", "this tree") else None
            linear.small_rows = limit if mode == "this tree" else small_rows_limit(linear.in_features)

    times = interleaved_steps(engine, batch, steps, MODES, use)
    limits = {f"{m.in_features}->{m.out_features}": limit for m, limit in zip(linears, measured)}
    print(json.dumps({mode: statistics.median(t) for mode, t in times.items()} | {"limits": limits}))


def interleaved_steps(engine, batch: int, steps: int, modes: tuple[str, ...], use) -> dict[str, list[float]]:
    """{mode: step ms}: `batch` greedy requests of 256-token prompts, 6 warm-up steps, then `steps` per mode,
    switching mode (`use(mode)`) every two steps so the machine's drift hits all of them."""
    import random
    import threading
    import time

    import torch

    from specfleet.engine.sampling_params import SamplingParams

    rng = random.Random(batch)
    for i in range(batch):
        engine.add_request(f"r{i}", [rng.randrange(1000, 40000) for _ in range(256)],
                           SamplingParams(temperature=0, max_tokens=10**6, ignore_eos=True))
    times: dict[str, list[float]] = {mode: [] for mode in modes}

    def run() -> None:
        with torch.inference_mode():
            for _ in range(6):
                engine.step()
            for i in range(steps * len(modes)):
                mode = modes[(i // 2) % len(modes)]
                use(mode)
                start = time.perf_counter()
                engine.step()
                times[mode].append((time.perf_counter() - start) * 1e3)

    thread = threading.Thread(target=run)      # as the server steps: off the thread that loaded the model
    thread.start()
    thread.join()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="6e173fe", help="commit whose CPU extension is the baseline")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--linear-rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60, help="steps per mode and repeat")
    parser.add_argument("--engine-flags", action="store_true", help="build --against with this tree's flags")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="the engine's dtype in the decode steps (the single calls stay float32)")
    parser.add_argument("--json", type=Path, default=RESULTS / "cpu_decode_ops.json")
    parser.add_argument("--child", nargs=2, metavar=("COMMIT", "BATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    from specfleet.engine.cpu.attention import CFLAGS

    cflags = list(CFLAGS) if args.engine_flags else None
    if args.child:
        child(args.child[0], int(args.child[1]), args.steps, cflags, args.dtype)
        return
    from rich.console import Console
    from rich.progress import track
    from rich.table import Table

    console = Console()
    calls = single_calls(build_against(args.against, cflags))
    table = Table(title=f"single calls at one decode row, median us (against = {args.against})")
    for column in ("op", "implementation", "us"):
        table.add_column(column)
    for row in calls:
        table.add_row(row["op"], row["impl"], f"{row['us']:.1f}")
    console.print(table)
    linears = linear_rows(args.linear_rows)
    table = Table(title="SmolLM2 linears, hot cache: median us per call")
    for column in ("linear", "rows", "oneDNN packed", "linear_small", "small / packed"):
        table.add_column(column)
    for row in linears:
        table.add_row(row["linear"], str(row["rows"]), f"{row['onednn_us']:.1f}", f"{row['small_us']:.1f}",
                      f"{row['small_us'] / row['onednn_us']:.2f}")
    console.print(table)

    runs: dict[int, list[dict]] = {batch: [] for batch in args.batches}
    jobs = [(repeat, batch) for repeat in range(args.repeats) for batch in args.batches]
    for repeat, batch in track(jobs, description="decode steps", console=console):
        command = [sys.executable, __file__, "--child", args.against, str(batch), "--steps", str(args.steps),
                   "--dtype", args.dtype,
                   *(["--engine-flags"] if args.engine_flags else [])]
        done = subprocess.run(command, capture_output=True, text=True, check=True, cwd="/")
        runs[batch].append(json.loads(done.stdout.strip().splitlines()[-1]))
    steps = Table(title=f"SmolLM2 decode step ms, {args.dtype}, 256-token prompts: "
                        f"median (min-max) over {args.repeats} repeats")
    for column in ("batch", *MODES, "this tree / against", "this tree / prior rule"):
        steps.add_column(column)
    summary = {}
    for batch, rows in runs.items():
        summary[batch] = {mode: {"median": statistics.median(r[mode] for r in rows), "min": min(r[mode] for r in rows),
                                 "max": max(r[mode] for r in rows)} for mode in MODES}
        s = summary[batch]
        steps.add_row(str(batch), *(f"{s[m]['median']:.1f} ({s[m]['min']:.1f}-{s[m]['max']:.1f})" for m in MODES),
                      f"{s['this tree']['median'] / s['against']['median']:.2f}",
                      f"{s['this tree']['median'] / s['prior rule']['median']:.2f}")
    console.print(steps)
    console.print(f"row limits (the machine's, from the cache), per repeat: {[r['limits'] for r in runs[args.batches[0]]]}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    report = {"config": vars(args) | {"json": str(args.json)}, "single_calls": calls, "linears": linears,
              "steps": summary, "runs": runs}
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
