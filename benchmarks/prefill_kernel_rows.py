"""The prefill attention kernel's register block: R query rows computed together, timed per variant.

Each variant is `engine/cpu/prefill_attention.cpp` with its `constexpr int R` replaced, built on its own
(the engine's flags, -march=native) into a temporary folder. All run on one SmolLM2 prefill layer's
attention (9 query / 3 KV heads of 64, a paged cache of `--tokens` tokens), `--rounds` rounds
alternating which variant goes first, each round the median of 50 calls after 5 warm-ups; the table
gives the median and range of the rounds and the largest difference of each variant's output from the
first one's (the rows are independent, so any R should give the same numbers).

    .venv/bin/python benchmarks/prefill_kernel_rows.py [--tokens 256] [--rows 4 6 8] [--threads 2]

Writes benchmarks/results/prefill_kernel_rows.json.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def build(rows: int, folder: Path):
    from torch.utils.cpp_extension import load_inline

    from specfleet.engine.cpu import attention

    header = attention.HEADER.read_text()

    def source(path: Path) -> str:
        text = path.read_text().replace('#include "vec_math.h"', header)
        if not path.name.startswith("prefill"):
            return text
        return re.sub(r"constexpr int R = \d+;", f"constexpr int R = {rows};", text)
    sources = [p for p in attention.SOURCES if p.name in ("paged_attention.cpp", "prefill_attention.cpp")]
    build_dir = folder / f"rows{rows}"
    build_dir.mkdir()
    return load_inline(name=f"prefill_rows_{rows}", cpp_sources=[source(p) for p in sources],
                       functions=["paged_attention_prefill"], build_directory=str(build_dir),
                       extra_cflags=attention.CFLAGS, extra_ldflags=["-fopenmp"]).paged_attention_prefill


def measure(tokens: int, variants: list[int], rounds: int) -> dict:
    import torch

    from cpu_backend import alternating_rounds    # benchmarks/cpu_backend.py
    from prefill_parts import layer_inputs      # benchmarks/prefill_parts.py: the same layer's inputs

    torch.manual_seed(0)
    q, k_cache, v_cache, meta = layer_inputs(tokens)
    group = meta.groups[0]
    with tempfile.TemporaryDirectory() as folder:
        kernels = {r: build(r, Path(folder)) for r in variants}

        def call(r: int):
            return kernels[r](q, k_cache, v_cache, group.block_tables, group.context_lens, tokens, 0.125)
        times = alternating_rounds({r: (lambda r=r: call(r)) for r in variants}, rounds, reps=50)
        first = call(variants[0])
        diffs = {r: float((call(r) - first).abs().max()) for r in variants}
    return {str(r): {"ms_per_layer": times[r], "median_ms": statistics.median(times[r]), "max_abs_diff": diffs[r]}
            for r in variants}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rows", type=int, nargs="+", default=[4, 6, 8])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=RESULTS / "prefill_kernel_rows.json")
    args = parser.parse_args()
    import torch
    from rich.console import Console
    from rich.table import Table

    torch.set_num_threads(args.threads)
    result = measure(args.tokens, args.rows, args.rounds)
    table = Table(title=f"prefill attention, {args.tokens} tokens, {args.threads} threads, {args.rounds} rounds")
    for column in ("R", "ms per layer, median (min-max)", f"vs R={args.rows[0]}", "max |diff|"):
        table.add_column(column)
    base = result[str(args.rows[0])]["median_ms"]
    for r, row in result.items():
        ms = row["ms_per_layer"]
        table.add_row(r, f"{row['median_ms']:.3f} ({min(ms):.3f}-{max(ms):.3f})", f"{row['median_ms'] / base:.2f}",
                      f"{row['max_abs_diff']:.1e}")
    Console().print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                                     "variants": result}, indent=1))


if __name__ == "__main__":
    main()
