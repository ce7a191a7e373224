"""Where a SmolLM2 prefill's time goes on CPU: is the first token bound by the GEMMs or by the rest?

1. A whole prefill step (`LLMEngine.step` over one fresh prompt of `--tokens` tokens, prefix caching
   off, so nothing is reused), on a thread other than the one that loaded the model (as the server
   steps), median and min-max over `--repeats` after two warm-ups; with the engine's prefill attention
   kernel and with SDPA in its place, alternating which goes first, `--repeats` steps each.
2. Each linear shape of SmolLM2 at `--tokens` rows through the oneDNN-packed GEMM the engine uses, in
   GFLOP/s, against a 2048x2048 fp32 matmul (about this CPU's sustained fp32 rate), and the whole
   prefill's GEMM time (30 layers x 4 shapes).
3. Prefill attention per layer (one sequence, 9 query / 3 KV heads of 64): SDPA with the engine's
   boolean mask, with `is_causal` for comparison, and the engine's kernel over a paged cache.

    .venv/bin/python benchmarks/prefill_parts.py [--tokens 256] [--repeats 10]

Prints a table and writes benchmarks/results/prefill_parts.json.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time
from pathlib import Path

from cpu_backend import median_ms      # benchmarks/cpu_backend.py: warm-up, then the median of the calls

RESULTS = Path(__file__).parent / "results"
LINEARS = {"qkv 576->960": (576, 960), "o 576->576": (576, 576), "gate_up 576->3072": (576, 3072),
           "down 1536->576": (1536, 576)}
LAYERS = 30


def prefill_steps(tokens: int, repeats: int) -> dict[str, list[float]]:
    from specfleet.engine.builtin import ensure_builtin
    from specfleet.engine.config import EngineConfig
    from specfleet.engine.engine import LLMEngine
    from specfleet.engine.sampling_params import SamplingParams
    from specfleet.engine.server.serve import load_off_the_main_thread

    engine = load_off_the_main_thread(lambda: LLMEngine(EngineConfig(ensure_builtin("smollm2-135m"),
                                                                     enable_prefix_caching=False)))
    rng = random.Random(0)

    def one() -> float:
        engine.add_request(f"r{rng.random()}", [rng.randrange(1000, 40000) for _ in range(tokens)],
                           SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
        start = time.perf_counter()
        engine.step()
        assert not engine.has_unfinished()         # one step: the whole prompt and its first token
        return (time.perf_counter() - start) * 1e3

    def use_kernel(on: bool) -> None:
        for layer in engine.runner.model.model.layers:
            layer.self_attn.attend.prefill_kernel = on

    for _ in range(2):
        one()
    steps: dict[str, list[float]] = {"kernel": [], "sdpa": []}
    for repeat in range(repeats):
        for mode in sorted(steps, reverse=repeat % 2 == 1):
            use_kernel(mode == "kernel")
            steps[mode].append(one())
    return steps


def gemms(tokens: int) -> dict:
    import torch

    out = {}
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    square = median_ms(lambda: a @ b, 10)
    out["square_2048_gflops"] = 2 * 2048 ** 3 / square / 1e6
    for name, (k, n) in LINEARS.items():
        x = torch.randn(tokens, k)
        packed = torch.ops.mkldnn._reorder_linear_weight(torch.randn(n, k) * 0.02, None)
        ms = median_ms(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""), 30)
        out[name] = {"ms": ms, "gflops": 2 * tokens * k * n / ms / 1e6}
    out["prefill_gemm_ms"] = LAYERS * sum(out[name]["ms"] for name in LINEARS)
    return out


def attention(tokens: int) -> dict:
    import torch
    import torch.nn.functional as F

    q, k, v = torch.randn(1, 9, tokens, 64), torch.randn(1, 3, tokens, 64), torch.randn(1, 3, tokens, 64)
    mask = torch.ones(tokens, tokens, dtype=torch.bool).tril()[None, None]
    masked = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True), 50)
    causal = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), 50)
    kernel = kernel_attention(tokens)
    return {"mask_ms_per_layer": masked, "causal_ms_per_layer": causal, "prefill_mask_ms": LAYERS * masked,
            "kernel_ms_per_layer": kernel, "prefill_kernel_ms": LAYERS * kernel}


def layer_inputs(tokens: int, block_size: int = 16, seqs: int = 1, dtype=None) -> tuple:
    """One SmolLM2 layer's prefill attention inputs: (q, k_cache, v_cache, the step's attention metadata,
    whose one group holds the prompts), random K/V of `seqs` fresh prompts of `tokens` tokens in a paged
    cache of `dtype` (fp32 by default)."""
    import torch

    from specfleet.engine.attention import build_metadata

    blocks = -(-tokens // block_size)
    tables = [list(range(1 + i * blocks, 1 + (i + 1) * blocks)) for i in range(seqs)]
    meta = build_metadata([tokens] * seqs, [tokens] * seqs, tables, block_size, "cpu")
    k_cache, v_cache = (torch.randn(seqs * blocks + 1, block_size, 3, 64).to(dtype or torch.float32) for _ in range(2))
    return torch.randn(seqs * tokens, 9, 64).to(dtype or torch.float32), k_cache, v_cache, meta


def kernel_attention(tokens: int) -> float:
    """The engine's prefill attention kernel over a paged cache holding the prompt's K/V."""
    from specfleet.engine.cpu.attention import load_kernel

    q, k_cache, v_cache, meta = layer_inputs(tokens)
    group = meta.groups[0]
    prefill = load_kernel().paged_attention_prefill
    return median_ms(lambda: prefill(q, k_cache, v_cache, group.block_tables, group.context_lens, tokens, 0.125), 50)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", type=Path, default=RESULTS / "prefill_parts.json")
    args = parser.parse_args()
    result: dict = {}

    def run() -> None:                   # off the main thread, as the engine server steps
        result["steps_ms"] = prefill_steps(args.tokens, args.repeats)
        result["gemm"] = gemms(args.tokens)
        result["attention"] = attention(args.tokens)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    from rich.console import Console
    from rich.table import Table

    steps, gemm, attn = result["steps_ms"], result["gemm"], result["attention"]
    table = Table(title=f"SmolLM2 prefill of {args.tokens} tokens")
    for column in ("part", "ms", "note"):
        table.add_column(column)
    for mode, times in steps.items():
        table.add_row(f"whole step ({mode})", f"{statistics.median(times):.1f} ({min(times):.1f}-{max(times):.1f})",
                      f"median (min-max) of {args.repeats}, alternating")
    for name in LINEARS:
        table.add_row(f"  {name} x {LAYERS}", f"{gemm[name]['ms'] * LAYERS:.1f}", f"{gemm[name]['gflops']:.0f} GFLOP/s")
    table.add_row("GEMMs", f"{gemm['prefill_gemm_ms']:.1f}", f"square 2048 matmul: {gemm['square_2048_gflops']:.0f} GFLOP/s")
    table.add_row(f"attention x {LAYERS} (SDPA, mask)", f"{attn['prefill_mask_ms']:.1f}",
                  f"per layer {attn['mask_ms_per_layer']:.2f} ms; is_causal {attn['causal_ms_per_layer']:.2f} ms")
    table.add_row(f"attention x {LAYERS} (kernel)", f"{attn['prefill_kernel_ms']:.1f}",
                  f"per layer {attn['kernel_ms_per_layer']:.2f} ms")
    rest = statistics.median(steps["kernel"]) - gemm["prefill_gemm_ms"] - attn["prefill_kernel_ms"]
    table.add_row("rest", f"{rest:.1f}", "elementwise, embedding, LM head row, sampling, scheduling")
    Console().print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"config": vars(args) | {"json": str(args.json)}, **result}, indent=2))


if __name__ == "__main__":
    main()
