"""A decode step on the thread that loaded the model, and on another thread: why the server loads off
the main thread.

libgomp keeps one worker pool per thread that ran a parallel region. When a second thread steps the
model while the loading thread's pool still exists, the pools together outnumber the cores and libgomp
cuts every worker's spin-wait short: workers sleep and wake at each parallel region. Each mode runs in
a fresh process (SmolLM2-135M, fp32, one sequence at 256 tokens of context); modes alternate, and the
table gives the median step and the voluntary context switches per step, median (min-max) over repeats.

    .venv/bin/python benchmarks/openmp_pools.py [--repeats 3] [--steps 40] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

MODES = {
    "load and step on the main thread": "main",
    "load on main, step on a thread (the server before)": "thread",
    "load on a thread that ends, step on another (the server now)": "thread-after-thread-load",
}
RESULTS = Path(__file__).parent / "results"


def child(mode: str, steps: int) -> None:
    """One measurement in this process: prints the median step ms and voluntary context switches per step."""
    import random
    import resource
    import threading
    import time

    import torch

    from specfleet.engine.builtin import ensure_builtin
    from specfleet.engine.config import EngineConfig
    from specfleet.engine.engine import LLMEngine
    from specfleet.engine.sampling_params import SamplingParams
    from specfleet.engine.server.serve import load_off_the_main_thread

    config = EngineConfig(model=str(ensure_builtin("smollm2-135m")), dtype="float32", num_kv_blocks=64)
    build = lambda: LLMEngine(config)                                           # noqa: E731
    engine = load_off_the_main_thread(build) if mode == "thread-after-thread-load" else build()
    rng = random.Random(0)
    engine.add_request("r", [rng.randrange(1000, 40000) for _ in range(256)],
                       SamplingParams(temperature=0, max_tokens=10**6, ignore_eos=True))
    out: dict[str, float] = {}

    def run() -> None:
        with torch.inference_mode():
            for _ in range(5):
                engine.step()
            switches = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
            times = []
            for _ in range(steps):
                start = time.perf_counter()
                engine.step()
                times.append(time.perf_counter() - start)
            out["step_ms"] = statistics.median(times) * 1e3
            out["switches_per_step"] = (resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - switches) / steps

    if mode == "main":
        run()
    else:
        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--json", type=Path, default=RESULTS / "openmp_pools.json")
    parser.add_argument("--child", choices=sorted(set(MODES.values())), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.steps)
        return
    from rich.console import Console
    from rich.table import Table

    runs: dict[str, list[dict]] = {name: [] for name in MODES}
    for repeat in range(args.repeats):
        order = list(MODES.items()) if repeat % 2 == 0 else list(MODES.items())[::-1]
        for name, mode in order:
            done = subprocess.run([sys.executable, __file__, "--child", mode, "--steps", str(args.steps)],
                                  capture_output=True, text=True, check=True, cwd="/")
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"repeat {repeat} {name}: {runs[name][-1]}", flush=True)
    table = Table(title="SmolLM2-135M decode step (batch 1, context 256): median (min-max) over repeats")
    for column in ("mode", "step ms", "voluntary context switches / step"):
        table.add_column(column)
    summary = {}
    for name, rows in runs.items():
        summary[name] = {key: {"median": statistics.median(r[key] for r in rows),
                               "min": min(r[key] for r in rows), "max": max(r[key] for r in rows)}
                         for key in ("step_ms", "switches_per_step")}
        s = summary[name]
        table.add_row(name, f"{s['step_ms']['median']:.1f} ({s['step_ms']['min']:.1f}-{s['step_ms']['max']:.1f})",
                      f"{s['switches_per_step']['median']:.1f} ({s['switches_per_step']['min']:.1f}-"
                      f"{s['switches_per_step']['max']:.1f})")
    Console().print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"config": {"repeats": args.repeats, "steps": args.steps}, "summary": summary,
                                     "runs": runs}, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
