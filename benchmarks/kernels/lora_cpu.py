"""The CPU multi-LoRA op for one SmolLM2-135M decode step: the extension's `lora_add` vs the plain-torch op.

One step is the 120 `add_lora` calls of the model's 30 layers (qkv, o, gate_up, down; SmolLM2-135M's widths),
each layer with its own slot tensors (8 adapters of rank 16, every projection adapted) so that the adapters'
133 MB come from memory as in a served step, on `--batch` rows spread round robin over the adapters (32: 4
rows each, `benchmarks/lora.py`'s decode batch). `KernelLoRAOps` (engine/cpu/lora.cpp) against
`TorchLoRAOps` (gathers and torch.bmm), alternating, median [min-max] ms per step over `--rounds`, each
round the median of `--reps` steps; both ops' outputs are checked to agree first. Prints a table and
writes JSON (default benchmarks/results/lora_cpu.json):
    .venv/bin/python benchmarks/kernels/lora_cpu.py [--batch 32] [--threads N] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from provenance import stamp  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results"
LAYERS, SLOTS, RANK, HIDDEN = 30, 8, 16, 576
PROJECTIONS = {"qkv": (HIDDEN, (576, 192, 192)), "o": (HIDDEN, (576,)), "gate_up": (HIDDEN, (1536, 1536)),
               "down": (1536, (HIDDEN,))}


def layer_tensors(gen: torch.Generator) -> list[dict]:
    """Per layer and projection: x, y and the slot tensors A [slots, parts * rank, in], B^T [slots, parts * rank, out]
    (random, block-diagonal as `LoRASlots` fills them)."""
    layers = []
    for _ in range(LAYERS):
        layer = {}
        for name, (fan_in, parts) in PROJECTIONS.items():
            a = torch.randn(SLOTS, len(parts) * RANK, fan_in, generator=gen) * 0.05
            bt = torch.zeros(SLOTS, len(parts) * RANK, sum(parts))
            column = 0
            for i, width in enumerate(parts):
                bt[:, i * RANK:(i + 1) * RANK, column:column + width] = torch.randn(SLOTS, RANK, width, generator=gen)
                column += width
            layer[name] = (a, bt, parts)
        layers.append(layer)
    return layers


def step(ops, state, layers: list[dict], xs: dict, ys: dict) -> None:
    for layer in layers:
        for name, (a, bt, parts) in layer.items():
            ops.add_lora(ys[name], xs[name], a, bt, state, parts)


def main() -> None:
    from rich.console import Console
    from rich.table import Table

    from specfleet.engine.cpu import attention
    from specfleet.engine.lora.layers import KernelLoRAOps, TorchLoRAOps

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", type=Path, default=RESULTS / "lora_cpu.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    kernel = attention.load_kernel()
    if kernel is None:
        sys.exit(f"the CPU extension does not build here: {attention.build_error()}")
    gen = torch.Generator().manual_seed(0)
    layers = layer_tensors(gen)
    xs = {name: torch.randn(args.batch, fan_in, generator=gen) for name, (fan_in, _) in PROJECTIONS.items()}
    ys = {name: torch.zeros(args.batch, sum(parts)) for name, (_, parts) in PROJECTIONS.items()}
    token_slots = torch.arange(args.batch) % SLOTS
    contenders = {"torch (gathers + bmm)": TorchLoRAOps, "extension lora_add": KernelLoRAOps(kernel)}
    states = {name: ops.prepare(token_slots, SLOTS, torch.float32) for name, ops in contenders.items()}
    with torch.inference_mode():
        outs = []
        for name, ops in contenders.items():
            y = torch.zeros(args.batch, 960)
            outs.append(ops.add_lora(y, xs["qkv"], *layers[0]["qkv"][:2], states[name], layers[0]["qkv"][2]))
        torch.testing.assert_close(outs[0], outs[1], atol=1e-3, rtol=1e-4)
        times: dict[str, list[float]] = {name: [] for name in contenders}
        for round_ in range(args.rounds):
            order = list(contenders.items())
            for name, ops in order[::-1] if round_ % 2 else order:
                step(ops, states[name], layers, xs, ys)                     # warm
                reps = []
                for _ in range(args.reps):
                    start = time.perf_counter()
                    step(ops, states[name], layers, xs, ys)
                    reps.append((time.perf_counter() - start) * 1e3)
                times[name].append(statistics.median(reps))
    rows = [{"op": name, "median_ms": statistics.median(t), "min_ms": min(t), "max_ms": max(t)}
            for name, t in times.items()]
    table = Table(title=f"LoRA op per SmolLM2 decode step: {args.batch} rows over {SLOTS} adapters of rank {RANK}, "
                        f"{args.threads} thread(s)")
    for col in ("op", "ms per step, median [min-max]"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["op"], f"{r['median_ms']:.2f} [{r['min_ms']:.2f}-{r['max_ms']:.2f}]")
    Console().print(table)
    speedup = rows[0]["median_ms"] / rows[1]["median_ms"]
    print(f"extension vs torch: {speedup:.2f}x faster")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    result = {**stamp("benchmarks/kernels/lora_cpu.py", sys.argv[1:]),
              "args": {k: str(v) for k, v in vars(args).items()}, "rows": rows, "speedup": speedup}
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
