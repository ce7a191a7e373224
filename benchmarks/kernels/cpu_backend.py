"""The CPU backend's two parts against what they replace, one layer / one matmul at a time.

1. Decode attention, one layer: 64 sequences, contexts uniform in [200, 400), 8 query / 4 KV heads of 64,
   random block tables over a 2,048-block pool: the C++ kernel (engine/cpu/paged_attention.cpp) vs the
   torch reference path (gather + permutes + batched matmuls).
2. Linear layers of the engine_throughput.py model at 64 rows: oneDNN-packed weights (engine/cpu/linear.py)
   vs `F.linear` (MKL sgemm).
Prints a table of median milliseconds and writes benchmarks/results/cpu_backend.json:
    .venv/bin/python benchmarks/kernels/cpu_backend.py [--threads 1]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

RESULTS = Path(__file__).resolve().parents[1] / "results"
LINEARS = {"qkv 512->1024": (512, 1024), "gate_up 512->2816": (512, 2816), "down 1408->512": (1408, 512),
           "lm_head 512->8192": (512, 8192)}


def median_ms(fn, reps: int = 20, warmups: int = 3) -> float:
    for _ in range(warmups):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def alternating_rounds(calls: dict, rounds: int, reps: int, warmups: int = 5) -> dict[str, list[float]]:
    """{name: one `median_ms` per round} for each callable, alternating which goes first from round to round."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for i in range(rounds):
        for name in list(calls) if i % 2 == 0 else list(calls)[::-1]:
            times[name].append(median_ms(calls[name], reps, warmups))
    return times


def attention_rows(seqs: int) -> list[dict]:
    from specfleet.engine.attention import TorchPagedAttention, build_metadata
    from specfleet.engine.cpu.attention import CpuPagedAttention

    gen = torch.Generator().manual_seed(0)
    ctx = torch.randint(200, 400, (seqs,), generator=gen).tolist()
    blocks = (torch.randperm(2047, generator=gen) + 1).tolist()
    tables = [blocks[25 * i:25 * i + -(-c // 16)] for i, c in enumerate(ctx)]
    meta = build_metadata([1] * seqs, ctx, tables, 16, "cpu")
    k_cache, v_cache = torch.randn(2048, 16, 4, 64, generator=gen), torch.randn(2048, 16, 4, 64, generator=gen)
    q = torch.randn(seqs, 8, 64, generator=gen)
    kv_bytes = sum(ctx) * 4 * 64 * 4 * 2
    rows = []
    for name, backend in (("torch reference", TorchPagedAttention(0.125)), ("C++ kernel", CpuPagedAttention(0.125))):
        ms = median_ms(lambda: backend(q, k_cache, v_cache, meta))
        rows.append({"part": "decode attention, 1 layer", "impl": name, "ms": ms, "kv_GB_per_s": kv_bytes / ms / 1e6})
    return rows


def linear_rows(rows_in: int) -> list[dict]:
    from torch import nn

    from specfleet.engine.cpu.linear import PackedLinear

    out = []
    for name, (k, n) in LINEARS.items():
        linear = nn.Linear(k, n, bias=False)
        packed, x = PackedLinear(linear), torch.randn(rows_in, k)
        with torch.inference_mode():
            for impl, fn in (("F.linear (MKL)", lambda: F.linear(x, linear.weight)), ("oneDNN packed", lambda: packed(x))):
                out.append({"part": f"{name}, {rows_in} rows", "impl": impl, "ms": median_ms(fn)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seqs", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from rich.console import Console
    from rich.table import Table

    rows = attention_rows(args.seqs) + linear_rows(args.seqs)
    table = Table(title=f"CPU backend parts, {args.threads} thread(s)")
    for col in ("part", "implementation", "median ms"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["part"], r["impl"], f"{r['ms']:.2f}")
    Console().print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "cpu_backend.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
