"""The prefill attention kernel of this tree against an earlier commit's, on one SmolLM2 layer.

Both extensions' `paged_attention_prefill` (the earlier one built from `--against`'s sources beside this
tree's, with this tree's flags) run the attention of one prefill step: `--seqs` fresh prompts of
`--tokens` tokens, 9 query / 3 KV heads of 64, in a paged cache of `--dtype`. `--rounds` rounds
alternate which kernel goes first; each round is the median of 30 calls after 5 warm-ups. The table
gives the median and range of the rounds, this / against per round, and each kernel's largest error
against the torch reference computed in fp32 on the same (rounded) inputs.

    .venv/bin/python benchmarks/prefill_attention_kernel.py --against 8b5b302 [--dtype bfloat16]
        [--seqs 8] [--tokens 256] [--rounds 7] [--threads 2] [--json benchmarks/results/prefill_attention_kernel.json]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results"


def build_against(commit: str):
    """`commit`'s paged_attention.cpp and prefill_attention.cpp (its vec_math.h inlined), built with this
    tree's flags under a name of their own."""
    from torch.utils.cpp_extension import load_inline

    from specfleet.engine.cpu.attention import CFLAGS, inline_header, kernel_build_dir

    def show(path: str) -> str:
        return subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout

    header = show("engine/cpu/vec_math.h")
    sources = [inline_header(show(f"engine/cpu/{name}"), header) for name in ("paged_attention.cpp", "prefill_attention.cpp")]
    tag = hashlib.sha1("".join(sources + CFLAGS).encode()).hexdigest()[:10]
    build_dir = kernel_build_dir().with_name(f"prefill-against-{tag}")
    build_dir.mkdir(parents=True, exist_ok=True)
    return load_inline(name=f"specfleet_prefill_against_{tag}", cpp_sources=sources,
                       functions=["paged_attention_prefill"], build_directory=str(build_dir),
                       extra_cflags=CFLAGS, extra_ldflags=["-fopenmp"]).paged_attention_prefill


def step_inputs(seqs: int, tokens: int, dtype, block_size: int = 16):
    """q, K/V caches and the attention group of one prefill step of `seqs` fresh prompts."""
    import torch

    from specfleet.engine.attention import build_metadata

    blocks = -(-tokens // block_size)
    tables = [list(range(1 + i * blocks, 1 + (i + 1) * blocks)) for i in range(seqs)]
    meta = build_metadata([tokens] * seqs, [tokens] * seqs, tables, block_size, "cpu")
    gen = torch.Generator().manual_seed(0)
    k_cache, v_cache = (torch.randn(seqs * blocks + 1, block_size, 3, 64, generator=gen).to(dtype) for _ in range(2))
    return torch.randn(seqs * tokens, 9, 64, generator=gen).to(dtype), k_cache, v_cache, meta


def measure(args) -> dict:
    import torch

    from cpu_backend import alternating_rounds      # benchmarks/cpu_backend.py
    from specfleet.engine.attention import TorchPagedAttention
    from specfleet.engine.cpu.attention import load_kernel

    q, k_cache, v_cache, meta = step_inputs(args.seqs, args.tokens, getattr(torch, args.dtype))
    group = meta.groups[0]
    kernels = {"against": build_against(args.against), "this tree": load_kernel().paged_attention_prefill}

    def call(name: str):
        return kernels[name](q, k_cache, v_cache, group.block_tables, group.context_lens, args.tokens, 0.125)
    times = alternating_rounds({name: (lambda name=name: call(name)) for name in kernels}, args.rounds, reps=30)
    reference = TorchPagedAttention(0.125)(q.float(), k_cache.float(), v_cache.float(), meta)
    errors = {name: float((call(name).float() - reference).abs().max()) for name in kernels}
    return {name: {"ms": times[name], "median_ms": statistics.median(times[name]), "max_abs_error": errors[name]}
            for name in kernels} | {"ratios": [a / b for a, b in zip(times["this tree"], times["against"])]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", required=True)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    parser.add_argument("--seqs", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=RESULTS / "prefill_attention_kernel.json")
    args = parser.parse_args()
    import torch
    from rich.console import Console
    from rich.table import Table

    torch.set_num_threads(args.threads)
    result = measure(args)
    table = Table(title=f"prefill attention, one layer: {args.seqs} x {args.tokens} tokens, {args.dtype}, "
                        f"{args.threads} threads, {args.rounds} rounds")
    for column in ("kernel", "ms, median (min-max)", "max |error| vs fp32 reference"):
        table.add_column(column)
    for name in ("against", "this tree"):
        row = result[name]
        table.add_row(f"{name} ({args.against})" if name == "against" else name,
                      f"{row['median_ms']:.3f} ({min(row['ms']):.3f}-{max(row['ms']):.3f})", f"{row['max_abs_error']:.1e}")
    Console().print(table)
    print("this tree / against per round:", ", ".join(f"{r:.2f}" for r in result["ratios"]))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                                     **result}, indent=1))


if __name__ == "__main__":
    main()
