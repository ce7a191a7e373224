"""Multi-LoRA serving cost: SmolLM2-135M with 8 LoRA adapters vs the base model alone, through the HTTP server.

Builds `--adapters` random-weight PEFT adapters of rank `--rank` with the `peft` package (every projection:
q/k/v/o and gate/up/down; B random, so each adapter changes the output) in a temp folder, then serves the
built-in SmolLM2-135M (`specfleet.engine.builtin`, fp32) in two modes:

    base  `specfleet engine serve` without LoRA; every request names the base model
    lora  `--enable-lora --max-loras <adapters> --lora-modules ...`; request i names adapter i mod N (round robin)

Both modes get the same random workload (vLLM's random dataset: streaming, greedy, ignore_eos) at
`--concurrency`. Each run starts a fresh server (no prefix cache or slot state carried across runs), warms it
up with a few requests (in lora mode one per adapter), then times `--prompts-per-slot` x concurrency
requests. Runs alternate base, lora, lora, base, ... over `--repeats`, each repeat with fresh prompts (the
same for both modes). Reported per mode: output tok/s, TTFT and TPOT p50/p99, median and min-max over the
repeats, and lora/base of the medians (target: throughput >= 0.8x). Before timing it checks that an
adapter changes a greedy completion (the LoRA path really runs). JSON: benchmarks/results/lora.json.

    .venv/bin/python benchmarks/lora.py [--concurrency 32] [--repeats 3] [--prompts-per-slot 2]
        [--random-input-len 256] [--random-output-len 128] [--adapters 8] [--rank 16]
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import commit, machine  # noqa: E402
from serving import NAME, Contender, flatten, start_specfleet, wait_ready  # noqa: E402

RESULTS = Path(__file__).parent / "results"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
METRICS = ("output_throughput", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99")
MODES = ("base", "lora")


def build_adapters(model: str, root: Path, count: int, rank: int) -> dict[str, str]:
    """`count` PEFT folders of random LoRA weights on `model`: name -> folder."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    folders = {}
    for i in range(count):
        torch.manual_seed(1000 + i)
        base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
        config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS, init_lora_weights=False)
        folder = root / f"adapter{i}"
        get_peft_model(base, config).save_pretrained(folder)
        folders[f"adapter{i}"] = str(folder)
    return folders


def start_server(mode: str, model: str, adapters: dict[str, str], rank: int, logdir: Path) -> Contender:
    extra: tuple[str, ...] = ()
    if mode == "lora":
        extra = ("--enable-lora", "--max-loras", str(len(adapters)), "--max-lora-rank", str(rank),
                 *[arg for name, path in adapters.items() for arg in ("--lora-modules", f"{name}={path}")])
    run_dir = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=logdir))
    server = start_specfleet(model, run_dir, extra)
    wait_ready(server, 300)
    return server


def request_models(mode: str, adapters: dict[str, str], num: int) -> list[str]:
    names = list(adapters) if mode == "lora" else [NAME]
    return [names[i % len(names)] for i in range(num)]


async def drive(base_url: str, requests, models: list[str], concurrency: int, on_done=None):
    """`requests` at `concurrency`, request i naming model models[i]; (results, seconds)."""
    import httpx

    from specfleet.cluster.loadgen import LoadTarget, send

    target = LoadTarget(base_url, NAME)
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=30.0),
                                 limits=httpx.Limits(max_connections=concurrency)) as client:
        async def one(req, model):
            async with limit:
                result = await send(client, dataclasses.replace(target, model=model), req)
            if on_done:
                on_done(result)
            return result

        start = time.perf_counter()
        results = await asyncio.gather(*(one(r, m) for r, m in zip(requests, models)))
    return list(results), time.perf_counter() - start


def greedy_text(base_url: str, model: str, prompt: str, tokens: int = 16) -> str:
    import httpx

    body = {"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0.0, "ignore_eos": True}
    return httpx.post(f"{base_url}/v1/completions", json=body, timeout=300).json()["choices"][0]["text"]


def one_run(mode: str, model: str, adapters: dict[str, str], rank: int, logdir: Path, warmup, requests,
            concurrency: int, on_done) -> tuple[dict, dict]:
    """A fresh server of `mode`: warm-up, then the timed requests; (flattened summary, check)."""
    from specfleet.cluster.loadgen import summarize

    server = start_server(mode, model, adapters, rank, logdir)
    try:
        check = {}
        if mode == "lora":
            prompt = "The capital of France is"
            check = {"adapter_changes_output": greedy_text(server.base_url, NAME, prompt)
                     != greedy_text(server.base_url, next(iter(adapters)), prompt)}
        asyncio.run(drive(server.base_url, warmup, request_models(mode, adapters, len(warmup)), concurrency))
        results, seconds = asyncio.run(drive(server.base_url, requests, request_models(mode, adapters, len(requests)),
                                             concurrency, on_done))
    finally:
        server.stop()
    return flatten(summarize(results, seconds, {})), check


def aggregate(runs: list[dict]) -> dict:
    return {m: {"median": statistics.median(r[m] for r in runs), "min": min(r[m] for r in runs),
                "max": max(r[m] for r in runs)} for m in METRICS} | {"failed": sum(r["failed"] for r in runs)}


def print_table(cells: dict, ratio: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="SmolLM2-135M: 8 LoRA adapters (round robin) vs base, median [min-max]")
    table.add_column("metric")
    for mode in MODES:
        table.add_column(mode, justify="right")
    table.add_column("lora/base", justify="right")
    for m in METRICS:
        fmt = "{:.1f}" if m == "output_throughput" else "{:.0f}"
        row = [f"{fmt.format(c[m]['median'])} [{fmt.format(c[m]['min'])}-{fmt.format(c[m]['max'])}]"
               for c in (cells[mode] for mode in MODES)]
        table.add_row(m + (" (tok/s)" if m == "output_throughput" else " (ms)"), *row, f"{ratio[m]:.2f}")
    table.add_row("failed", *[str(cells[mode]["failed"]) for mode in MODES], "")
    Console().print(table)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n", 2)[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per mode (each on a fresh server)")
    parser.add_argument("--prompts-per-slot", type=int, default=2, help="timed requests = this x concurrency")
    parser.add_argument("--warmup", type=int, default=8, help="untimed requests per fresh server")
    parser.add_argument("--random-input-len", type=int, default=256)
    parser.add_argument("--random-output-len", type=int, default=128)
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--json", type=Path, default=RESULTS / "lora.json")
    return parser.parse_args()


def main() -> None:
    from rich.progress import Progress

    from specfleet.cluster.loadgen import load_tokenizer, random_requests
    from specfleet.engine.builtin import ensure_builtin

    args = parse_args()
    model = str(ensure_builtin(NAME))
    logdir = Path(tempfile.mkdtemp(prefix="lora-bench-"))
    adapters = build_adapters(model, logdir / "adapters", args.adapters, args.rank)
    tokenizer = load_tokenizer(model)
    num = args.prompts_per_slot * args.concurrency
    warmup = random_requests(tokenizer, max(args.warmup, args.adapters), args.random_input_len, 16, 0.0, seed=7)
    raw: dict[str, list[dict]] = {mode: [] for mode in MODES}
    checks = []
    with Progress() as progress:
        task = progress.add_task("requests", total=num * len(MODES) * args.repeats)
        for repeat in range(args.repeats):
            requests = random_requests(tokenizer, num, args.random_input_len, args.random_output_len, 0.0,
                                       seed=repeat * 100_003 + 1)
            for mode in (MODES if repeat % 2 == 0 else MODES[::-1]):
                row, check = one_run(mode, model, adapters, args.rank, logdir, warmup, requests, args.concurrency,
                                     lambda _: progress.advance(task))
                raw[mode].append(row)
                if check:
                    checks.append(check)
                progress.console.print(f"repeat {repeat} {mode}: {row['output_throughput']:.1f} tok/s, "
                                       f"TTFT p50 {row['ttft_p50']:.0f} ms, TPOT p50 {row['tpot_p50']:.0f} ms, "
                                       f"failed {row['failed']}")
    cells = {mode: aggregate(runs) for mode, runs in raw.items()}
    ratio = {m: cells["lora"][m]["median"] / cells["base"][m]["median"] for m in METRICS}
    print_table(cells, ratio)
    python = os.path.relpath(sys.executable, Path(__file__).resolve().parents[1])
    result = {"command": " ".join([python, *sys.argv]), "commit": commit(), "machine": machine(),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()} | {"model": model},
              "adapter_checks": checks, "cells": cells, "lora/base": ratio,
              "meets_target": ratio["output_throughput"] >= 0.8, "runs": raw}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"lora/base throughput {ratio['output_throughput']:.2f} (target >= 0.80); wrote {args.json}")


if __name__ == "__main__":
    main()
