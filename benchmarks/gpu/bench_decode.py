"""GPU check and roofline of the engine's decode step, for one lent CUDA device (see run.sh).

Stages, each recorded in the JSON even if a later one fails:
  1. kernels: triton paged attention and the K/V write vs the torch path at a 1B model's shapes (bf16),
     ||out - ref|| / ||ref|| with the reference in fp32; and the attention kernel's own KV bandwidth.
  2. bandwidth: device-to-device copy of 2 GiB, bytes read + written over the median time.
  3. decode: a ~1.2B-parameter random-weight Llama (Llama-3.2-1B's shape) in bf16 through LLMEngine;
     for B = 1..256 sequences of ~CONTEXT tokens: the engine step (schedule, forward, sample), the
     model forward alone, and the forward replayed from a CUDA graph; each against the roofline
     (weight bytes + B * context * KV bytes per token) / measured bandwidth.
  4. e2e: output tokens/s of LLM.generate vs transformers generate() on the same model and prompts.
Prints a table last and writes JSON to --out.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

LLAMA_1B = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=4096,
                tie_word_embeddings=True, rope_theta=500000.0, initializer_range=0.02)
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
CONTEXT = 512            # prompt tokens per sequence before the timed decode steps
BLOCK = 16


def median_ms(fn, warmup: int = 3, reps: int = 20) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


# ---- 1. kernels -------------------------------------------------------------------------------
def random_step(qlens, ctx, kv_heads, head_dim, dtype, seed):
    from specfleet.engine.attention import build_metadata

    gen = torch.Generator().manual_seed(seed)
    order = sorted(range(len(qlens)), key=lambda i: qlens[i])
    qlens, ctx = [qlens[i] for i in order], [ctx[i] for i in order]
    need = sum(-(-c // BLOCK) for c in ctx)
    perm = (torch.randperm(need + 8, generator=gen) + 1).tolist()
    tables, used = [], 0
    for c in ctx:
        n = -(-c // BLOCK)
        tables.append(perm[used:used + n])
        used += n
    meta = build_metadata(qlens, ctx, tables, BLOCK, "cuda")
    shape = (need + 9, BLOCK, kv_heads, head_dim)
    k = torch.randn(shape, device="cuda", dtype=dtype)
    v = torch.randn(shape, device="cuda", dtype=dtype)
    return meta, k, v


def check_kernels() -> dict:
    from specfleet.engine.attention import TorchPagedAttention, write_kv
    from specfleet.engine.kernels.paged_attention import paged_attention
    from specfleet.engine.kernels.reshape_and_cache import reshape_and_cache

    kv_heads, q_heads, d = 8, 32, 64
    cases = {"decode-64": ([1] * 64, [int(x) for x in torch.randint(1, 2048, (64,))]),
             "verify-k4-32": ([5] * 32, [int(x) for x in torch.randint(5, 1500, (32,))]),
             "mixed": ([1] * 16 + [5] * 8 + [300, 512], [int(x) for x in torch.randint(600, 1200, (26,))])}
    results = {}
    for seed, (name, (qlens, ctx)) in enumerate(cases.items()):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            meta, k, v = random_step(qlens, ctx, kv_heads, d, dtype, seed)
            q = torch.randn(sum(qlens), q_heads, d, device="cuda", dtype=dtype)
            out = torch.full_like(q, float("nan"))
            paged_attention(q, k, v, meta, d ** -0.5, out=out)
            ref = TorchPagedAttention(d ** -0.5)(q.float(), k.float(), v.float(), meta)
            err = ((out.float() - ref).norm() / ref.norm()).item()
            limit = 1e-4 if dtype == torch.float32 else 2e-2
            results[f"{name}/{str(dtype)[6:]}"] = {"rel_err": err, "ok": bool(err < limit and not out.isnan().any())}
    k = torch.randn(300, 8, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    slots = torch.randperm(64 * BLOCK, device="cuda")[:300]
    slots[::7] = -1
    kc = torch.randn(64, BLOCK, 8, 64, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    kr, vr = kc.clone(), vc.clone()
    keep = slots >= 0
    write_kv(kr, vr, k[keep], v[keep], slots[keep])
    reshape_and_cache(kc, vc, k, v, slots)
    results["reshape_and_cache"] = {"ok": bool(torch.equal(kc, kr) and torch.equal(vc, vr))}
    return results


def attention_bandwidth() -> list[dict]:
    """The attention kernel alone on decode steps: KV bytes read over its median time."""
    from specfleet.engine.kernels.paged_attention import paged_attention

    rows = []
    for batch, ctx in [(1, 1024), (1, 8192), (64, 1024), (256, 1024)]:
        meta, k, v = random_step([1] * batch, [ctx] * batch, 8, 64, torch.bfloat16, 0)
        q = torch.randn(batch, 32, 64, device="cuda", dtype=torch.bfloat16)
        ms = median_ms(lambda: paged_attention(q, k, v, meta, 0.125), reps=50)
        kv_bytes = 2 * batch * ctx * 8 * 64 * 2
        rows.append({"batch": batch, "context": ctx, "ms": ms, "GBps": kv_bytes / ms / 1e6})
    return rows


# ---- 2. bandwidth -------------------------------------------------------------------------------
def copy_bandwidth() -> float:
    src = torch.randn(2**29, device="cuda", dtype=torch.float32)      # 2 GiB
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), reps=30)
    return 2 * src.numel() * 4 / ms / 1e6                                  # GB/s, read + write


# ---- 3. decode ----------------------------------------------------------------------------------
def build_model(folder: Path) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    from specfleet.engine.tiny_model import build_tokenizer

    tokenizer = build_tokenizer(512)
    config = LlamaConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         architectures=["LlamaForCausalLM"], **LLAMA_1B)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    del model
    torch.cuda.empty_cache()
    return folder


def make_engine(path: Path, max_seqs: int):
    from specfleet.engine import EngineConfig, LLMEngine

    blocks = max_seqs * (-(-(CONTEXT + 64) // BLOCK)) + 64
    return LLMEngine(EngineConfig(model=str(path), num_kv_blocks=blocks, block_size=BLOCK, max_num_seqs=max_seqs,
                                  max_num_batched_tokens=8192, enable_prefix_caching=False, dtype="bfloat16",
                                  attention_backend="triton"))


def fill_decode_batch(engine, batch: int, vocab: int) -> None:
    from specfleet.engine import SamplingParams

    gen = torch.Generator().manual_seed(batch)
    for i in range(batch):
        prompt = torch.randint(10, vocab, (CONTEXT,), generator=gen).tolist()
        engine.add_request(f"b{batch}-{i}", prompt, SamplingParams(temperature=0, max_tokens=10_000, ignore_eos=True))
    while engine.num_waiting or any(s.num_output_tokens == 0 for s in engine.scheduler.running):
        engine.step()


def model_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())      # tied weights count once


def decode_sweep(path: Path, bandwidth_gbps: float) -> list[dict]:
    engine = make_engine(path, max(BATCHES))
    model, runner = engine.runner.model, engine.runner
    s = model.shape
    kv_per_token = 2 * s.num_layers * s.num_kv_heads * s.head_dim * 2
    weights = model_bytes(model)
    rows = []
    for batch in BATCHES:
        fill_decode_batch(engine, batch, s.vocab_size)
        steps = []
        for _ in range(12):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            engine.step()
            torch.cuda.synchronize()
            steps.append((time.perf_counter() - t0) * 1e3)
        step_ms = statistics.median(steps[2:])
        scheduled = engine.scheduler.schedule()                # one more decode step, run by hand
        inputs = runner.prepare(scheduled)

        @torch.inference_mode()
        def forward():
            return model.compute_logits(model(inputs.input_ids, inputs.positions, runner.kv_caches, inputs.meta))

        forward_ms = median_ms(forward, reps=10)
        graph_ms = graph_replay_ms(forward)
        context = CONTEXT + 14
        roofline_ms = (weights + batch * context * kv_per_token) / bandwidth_gbps / 1e6
        rows.append({"batch": batch, "context": context, "step_ms": step_ms, "forward_ms": forward_ms,
                     "graph_ms": graph_ms, "roofline_ms": roofline_ms,
                     "step_ratio": roofline_ms / step_ms, "graph_ratio": roofline_ms / graph_ms,
                     "tok_per_s_step": batch / step_ms * 1e3})
        for seq in list(engine.scheduler.running):
            engine.abort(seq.request_id)
        engine.step()
    return rows


def graph_replay_ms(forward) -> float:
    """The same decode forward captured once in a CUDA graph (what a graph-backed runner would pay)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.inference_mode():
        for _ in range(2):
            forward()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.inference_mode():
        forward()
    return median_ms(graph.replay, reps=20)


# ---- 4. end to end ------------------------------------------------------------------------------
def end_to_end(path: Path, batch: int = 32, prompt_len: int = 128, new_tokens: int = 128) -> dict:
    from transformers import AutoModelForCausalLM, GenerationConfig

    from specfleet.engine import LLM, SamplingParams

    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(10, 500, (batch, prompt_len), generator=gen)
    llm = LLM(str(path), num_kv_blocks=batch * 24 + 64, block_size=BLOCK, max_num_seqs=batch,
              dtype="bfloat16", attention_backend="triton")
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    llm.generate(prompts[:2].tolist(), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = llm.generate(prompts.tolist(), params)
    ours = sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t0)
    del llm
    torch.cuda.empty_cache()
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    hf.generation_config.eos_token_id = None           # exactly new_tokens each, like ignore_eos
    config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    ids = prompts.cuda()
    with torch.inference_mode():
        hf.generate(ids[:2], generation_config=GenerationConfig(max_new_tokens=4, do_sample=False, pad_token_id=0))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
        torch.cuda.synchronize()
    theirs = (out.shape[1] - prompt_len) * batch / (time.perf_counter() - t0)
    return {"batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens,
            "specfleet_tok_per_s": ours, "transformers_tok_per_s": theirs, "speedup": ours / theirs}


def stage(results: dict, name: str, fn, *args):
    t0 = time.perf_counter()
    try:
        results[name] = fn(*args)
    except Exception as exc:                                           # keep the other stages' numbers
        traceback.print_exc()
        results[name] = {"error": f"{type(exc).__name__}: {exc}"}
    print(f"[{name}] {time.perf_counter() - t0:.1f}s: {json.dumps(results[name])[:600]}", flush=True)
    return results[name]


def print_table(results: dict) -> None:
    rows = results.get("decode")
    print(f"\nGPU {results['device']}  copy bandwidth {results.get('bandwidth_GBps', 0):.0f} GB/s")
    if isinstance(rows, list):
        print(f"{'B':>4} {'roofline ms':>11} {'step ms':>8} {'fwd ms':>7} {'graph ms':>8} {'roof/step':>9} "
              f"{'roof/graph':>10} {'tok/s':>8}")
        for r in rows:
            print(f"{r['batch']:>4} {r['roofline_ms']:>11.3f} {r['step_ms']:>8.3f} {r['forward_ms']:>7.3f} "
                  f"{r['graph_ms']:>8.3f} {r['step_ratio']:>9.2f} {r['graph_ratio']:>10.2f} "
                  f"{r['tok_per_s_step']:>8.0f}")
    e2e = results.get("e2e", {})
    if "speedup" in e2e:
        print(f"e2e B={e2e['batch']}: specfleet {e2e['specfleet_tok_per_s']:.0f} tok/s, transformers "
              f"{e2e['transformers_tok_per_s']:.0f} tok/s, x{e2e['speedup']:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="benchmarks/results/gpu_decode.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    results: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    checks = stage(results, "kernels", check_kernels)
    stage(results, "attention_bandwidth", attention_bandwidth)
    bandwidth = stage(results, "bandwidth_GBps", copy_bandwidth)
    with tempfile.TemporaryDirectory() as tmp:
        path = stage(results, "build_model", lambda: str(build_model(Path(tmp) / "llama-1b")))
        if isinstance(path, str):
            stage(results, "decode", decode_sweep, Path(path), bandwidth)
            stage(results, "e2e", end_to_end, Path(path))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print_table(results)
    ok = isinstance(checks, dict) and all(v.get("ok") for v in checks.values() if isinstance(v, dict))
    print("kernel checks:", "PASS" if ok else "FAIL")
    if isinstance(rows := results.get("decode"), list) and rows:
        print(f"decode B=1: roofline/graph {rows[0]['graph_ratio']:.2f}, roofline/step {rows[0]['step_ratio']:.2f} "
              f"(target >= 0.67, i.e. within 1.5x of the roofline)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
