"""The prefill attention kernel of this tree against an earlier commit's, on one SmolLM2 layer.

Both extensions' `paged_attention_prefill` (the earlier one built from `--against`'s sources beside this
tree's, with this tree's flags) run the attention of one prefill step: `--seqs` fresh prompts of
`--tokens` tokens, 9 query / 3 KV heads of 64, in a paged cache of `--dtype`. `--rounds` rounds
alternate which kernel goes first; each round is the median of 30 calls after 5 warm-ups. The table
gives the median and range of the rounds, this / against per round, and each kernel's largest error
against the torch reference computed in fp32 on the same (rounded) inputs, and whether the two outputs are
equal bit for bit. The same layer's K/V cache
write follows, this tree's `write_kv` against `attention.write_kv` (index_copy_), K and V as views into a
fused QKV output as the model passes them, in the same alternating rounds.

    .venv/bin/python benchmarks/prefill_attention_kernel.py --against 8b5b302 [--dtype bfloat16]
        [--seqs 8] [--tokens 256] [--rounds 7] [--threads 2] [--json benchmarks/results/prefill_attention_kernel.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def measure(args) -> dict:
    import torch

    from cpu_backend import alternating_rounds      # benchmarks/cpu_backend.py
    from cpu_decode_ops import build_against        # benchmarks/cpu_decode_ops.py
    from prefill_parts import layer_inputs           # benchmarks/prefill_parts.py
    from specfleet.engine.attention import TorchPagedAttention
    from specfleet.engine.cpu.attention import CFLAGS, load_kernel

    torch.manual_seed(0)
    q, k_cache, v_cache, meta = layer_inputs(args.tokens, seqs=args.seqs, dtype=getattr(torch, args.dtype))
    group = meta.groups[0]
    against = build_against(args.against, CFLAGS, ("paged_attention.cpp", "prefill_attention.cpp"),
                            ["paged_attention_prefill"])
    kernels = {"against": against.paged_attention_prefill, "this tree": load_kernel().paged_attention_prefill}

    def call(name: str):
        return kernels[name](q, k_cache, v_cache, group.block_tables, group.context_lens, args.tokens, 0.125)
    times = alternating_rounds({name: (lambda name=name: call(name)) for name in kernels}, args.rounds, reps=30)
    reference = TorchPagedAttention(0.125)(q.float(), k_cache.float(), v_cache.float(), meta)
    outputs = {name: call(name) for name in kernels}
    errors = {name: float((out.float() - reference).abs().max()) for name, out in outputs.items()}
    return {name: {"ms": times[name], "median_ms": statistics.median(times[name]), "max_abs_error": errors[name]}
            for name in kernels} | {"ratios": [a / b for a, b in zip(times["this tree"], times["against"])],
                                    "identical": torch.equal(outputs["this tree"], outputs["against"]),
                                    "kv_write": kv_write(args, q, k_cache, meta.slot_mapping)}


def kv_write(args, q, k_cache, slots) -> dict:
    """The layer's K/V write: {"kernel" | "index_copy_": ms per round, ...} with the kernel / index_copy_ ratios."""
    import torch

    from cpu_backend import alternating_rounds      # benchmarks/cpu_backend.py
    from specfleet.engine.attention import write_kv
    from specfleet.engine.cpu.attention import load_kernel

    q_size, kv_heads, head_dim = q.shape[1] * q.shape[2], k_cache.shape[2], k_cache.shape[3]
    kv_size = kv_heads * head_dim
    qkv = torch.randn(q.shape[0], q_size + 2 * kv_size).to(k_cache.dtype)      # the fused projection's output
    k, v = (qkv[:, start:start + kv_size].view(-1, kv_heads, head_dim) for start in (q_size, q_size + kv_size))
    caches = (k_cache.clone(), k_cache.clone())
    writes = {"kernel": load_kernel().write_kv, "index_copy_": write_kv}
    times = alternating_rounds({name: (lambda f=f: f(*caches, k, v, slots)) for name, f in writes.items()},
                               args.rounds, reps=30)
    return times | {"ratios": [a / b for a, b in zip(times["kernel"], times["index_copy_"])]}


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
    print("outputs bit for bit equal:", result["identical"])
    write = result["kv_write"]
    print("K/V write, ms median (min-max): " + "; ".join(
        f"{name} {statistics.median(write[name]):.3f} ({min(write[name]):.3f}-{max(write[name]):.3f})"
        for name in ("kernel", "index_copy_")))
    print("kernel / index_copy_ per round:", ", ".join(f"{r:.2f}" for r in write["ratios"]))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                                     **result}, indent=1))


if __name__ == "__main__":
    main()
