"""SiLU-and-mul in the CPU extension: this tree's two-pass loop against an earlier commit's one-pass loop.

In the one-pass loop `gate / (1 + exp(-gate)) * up` GCC evaluates exp's clamped branch for every lane
(a division by 1 + exp(88.3) ~ 2e38) and blends it in; that quotient is subnormal for every ordinary gate,
and each subnormal result costs a microcode assist. The check for that mechanism: the same call with
subnormals flushed to zero (`torch.set_flush_denormal`) is fast again. The flag is the calling thread's,
so it shows only where the call runs on that thread (up to 21 rows: fewer than 2^16 elements).

`--against`'s sources are built with this tree's compiler flags (`-fno-trapping-math` among them, as the
engine builds them).

1. Single calls at SmolLM2's shape (2 x 1,536 per row) and 1 to 2,048 rows, gates ~ N(0, 1): torch ops
   (`TorchElementwise`), `--against`'s extension, that extension with subnormals flushed, and this
   tree's; median microseconds over `--rounds` rounds, the order of the implementations alternating.
2. Whole engine steps of SmolLM2 (off the loading thread, as the server steps): a prefill step of
   `--prompts` prompts of 256 tokens (2,048 tokens: what one step of the c=32 serving run computes)
   and decode steps at batch 32, with `--against`'s elementwise ops and with this tree's, alternating
   step by step; each repeat a fresh process; median (min-max) of the per-process medians.

    .venv/bin/python benchmarks/silu_kernel.py [--against 9d060ea] [--repeats 3]
        [--json benchmarks/results/silu_kernel.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from cpu_decode_ops import build_against, median_us   # benchmarks/cpu_decode_ops.py

from specfleet.engine.cpu.attention import CFLAGS

RESULTS = Path(__file__).parent / "results"
ROWS = (1, 8, 32, 256, 2048)
IMPLS = ("torch ops", "against", "against, subnormals flushed", "this tree")
STEP_MODES = ("against", "this tree")


def single_calls(against, rounds: int) -> list[dict]:
    import torch

    from specfleet.engine.cpu.attention import load_kernel
    from specfleet.engine.model.llama import TorchElementwise

    ops = {"torch ops": TorchElementwise, "against": against, "against, subnormals flushed": against,
           "this tree": load_kernel()}
    out = []
    with torch.inference_mode():
        for rows in ROWS:
            x = torch.randn(rows, 2 * 1536, generator=torch.Generator().manual_seed(rows))
            calls = max(5, 20000 // rows)
            times: dict[str, list[float]] = {name: [] for name in IMPLS}
            for r in range(rounds):
                for name in (IMPLS[::-1] if r % 2 else IMPLS):
                    torch.set_flush_denormal(name.endswith("flushed"))
                    times[name].append(median_us(lambda: ops[name].silu_and_mul(x), calls, repeats=3))
                torch.set_flush_denormal(False)
            out += [{"rows": rows, "impl": name, "us": statistics.median(t)} for name, t in times.items()]
    return out


def child(commit: str, prompts: int, decode_steps: int) -> None:
    """One repeat in this process: prints {"prefill": {mode: ms}, "decode": {mode: ms}} (medians)."""
    import random
    import threading
    import time

    import torch

    from specfleet.engine.builtin import ensure_builtin
    from specfleet.engine.config import EngineConfig
    from specfleet.engine.cpu.attention import load_kernel
    from specfleet.engine.engine import LLMEngine
    from specfleet.engine.sampling_params import SamplingParams
    from specfleet.engine.server.serve import load_off_the_main_thread

    config = EngineConfig(model=str(ensure_builtin("smollm2-135m")), dtype="float32", enable_prefix_caching=False)
    engine, against = load_off_the_main_thread(lambda: (LLMEngine(config), build_against(commit, CFLAGS)))
    model, current, rng = engine.runner.model, load_kernel(), random.Random(prompts)
    times = {kind: {mode: [] for mode in STEP_MODES} for kind in ("prefill", "decode")}

    def add(count: int, max_tokens: int) -> None:
        for _ in range(count):
            engine.add_request(f"r{rng.random()}", [rng.randrange(1000, 40000) for _ in range(256)],
                               SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))

    def timed_step(kind: str, mode: str) -> None:
        model.set_elementwise(against if mode == "against" else current)
        start = time.perf_counter()
        engine.step()
        times[kind][mode].append((time.perf_counter() - start) * 1e3)

    def run() -> None:
        with torch.inference_mode():
            for i in range(2 + 2 * 5):                      # two warm-ups, then five of each, alternating
                add(prompts, 1)
                timed_step("prefill", STEP_MODES[i % 2])
                assert not engine.has_unfinished()
            for name in STEP_MODES:
                times["prefill"][name] = times["prefill"][name][1:]
            add(32, 10**6)
            while engine.scheduler.waiting or any(s.num_output_tokens == 0 for s in engine.scheduler.running):
                engine.step()
            for i in range(2 * decode_steps):
                timed_step("decode", STEP_MODES[(i // 2) % 2])

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    print(json.dumps({kind: {mode: statistics.median(t) for mode, t in by_mode.items()}
                      for kind, by_mode in times.items()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="9d060ea", help="commit whose CPU extension is the baseline")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes for the whole steps")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--decode-steps", type=int, default=20, help="decode steps per mode and repeat")
    parser.add_argument("--json", type=Path, default=RESULTS / "silu_kernel.json")
    parser.add_argument("--child", metavar="COMMIT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.prompts, args.decode_steps)
        return
    from rich.console import Console
    from rich.progress import track
    from rich.table import Table

    console = Console()
    calls = single_calls(build_against(args.against, CFLAGS), args.rounds)
    table = Table(title=f"silu_and_mul, 2 x 1,536 per row: median us over {args.rounds} rounds "
                        f"(against = {args.against})")
    for column in ("rows", *IMPLS, "this tree / against"):
        table.add_column(column, justify="right")
    by = {(c["rows"], c["impl"]): c["us"] for c in calls}
    for rows in ROWS:
        table.add_row(str(rows), *(f"{by[rows, name]:.1f}" for name in IMPLS),
                      f"{by[rows, 'this tree'] / by[rows, 'against']:.2f}")
    console.print(table)

    runs = []
    for _ in track(range(args.repeats), description="whole steps", console=console):
        command = [sys.executable, __file__, "--child", args.against, "--prompts", str(args.prompts),
                   "--decode-steps", str(args.decode_steps)]
        done = subprocess.run(command, capture_output=True, text=True, check=True, cwd=Path(__file__).parent)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    steps = Table(title=f"SmolLM2 step ms: median (min-max) of {args.repeats} processes' medians")
    for column in ("step", *STEP_MODES, "this tree / against (per process)"):
        steps.add_column(column, justify="right")
    summary = {}
    for kind, label in (("prefill", f"prefill, {args.prompts} x 256 tokens"), ("decode", "decode, batch 32")):
        values = {mode: [r[kind][mode] for r in runs] for mode in STEP_MODES}
        summary[kind] = {mode: {"median": statistics.median(v), "min": min(v), "max": max(v)}
                         for mode, v in values.items()}
        paired = [t / a for t, a in zip(values["this tree"], values["against"])]
        steps.add_row(label, *(f"{summary[kind][m]['median']:.1f} ({summary[kind][m]['min']:.1f}-"
                               f"{summary[kind][m]['max']:.1f})" for m in STEP_MODES),
                      ", ".join(f"{p:.2f}" for p in paired))
    console.print(steps)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    report = {"config": {k: v for k, v in vars(args).items() if k != "child"} | {"json": str(args.json)},
              "single_calls": calls, "steps": summary, "runs": runs}
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
