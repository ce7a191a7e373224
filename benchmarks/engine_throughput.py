"""Offline throughput: specfleet vs transformers static batching vs vLLM's CPU backend, one run.

Same machine, same random-weight Llama (hidden 512, 4 layers, 8/4 heads, vocab 8192), fp32 unless `--dtype`, same
workload (64 requests, prompt and output lengths uniform in [16, 256], token ids, greedy, ignore EOS).
Each engine runs `--repeats` times, the order of the engines alternating between repeats (each run a
fresh engine; vLLM's start-up excluded); the table gives the median output tokens/s with the min-max,
and specfleet / engine ratios of the medians. Writes benchmarks/results/engine_throughput.json.
vLLM runs only where its CPU build is installed in its own venv (see docs/benchmarks.md):
    python benchmarks/engine_throughput.py [--repeats 3] [--vllm-python /tmp/vllm-peer/bin/python] [--model smollm2-135m]
        [--dtype float32|bfloat16]
`--output-len 1` with `--min-len 256 --max-len 256` times prefill alone (each request's one token is its
prefill's). `--model` runs the same workload on a model folder or the built-in real SmolLM2-135M instead (token ids
drawn from its vocabulary) and writes engine_throughput_<name>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from provenance import stamp                     # benchmarks/provenance.py: command, commit, machine, date

RESULTS = Path(__file__).parent / "results"
MODEL_SHAPE = dict(vocab_size=8192, hidden_size=512, num_layers=4, num_heads=8, num_kv_heads=4,
                   intermediate_size=1408, max_position_embeddings=1024)


def workload(n: int, lo: int, hi: int, vocab: int, seed: int = 0,
             output_len: int | None = None) -> list[tuple[list[int], int]]:
    gen = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(lo, hi + 1, (n,), generator=gen).tolist()
    output_lens = torch.randint(lo, hi + 1, (n,), generator=gen).tolist()
    if output_len is not None:
        output_lens = [output_len] * n
    return [(torch.randint(10, vocab, (p,), generator=gen).tolist(), o) for p, o in zip(prompt_lens, output_lens)]


def run_specfleet(model: str, work, dtype: str = "float32") -> dict:
    from specfleet.engine import LLM, SamplingParams

    llm = LLM(model, num_kv_blocks=2048, max_num_seqs=64, max_num_batched_tokens=2048, dtype=dtype)
    llm.generate([[11, 12, 13]], SamplingParams(max_tokens=4))                    # warm-up
    waste = KvWasteMeter(llm.engine)
    llm.engine.step_listeners.append(waste)
    params = [SamplingParams(temperature=0, max_tokens=o, ignore_eos=True) for _, o in work]
    start = time.perf_counter()
    outs = llm.generate([p for p, _ in work], params)
    elapsed = time.perf_counter() - start
    tokens = sum(len(o.token_ids) for o in outs)
    return {"output_tokens": tokens, "seconds": elapsed, "tok_per_s": tokens / elapsed,
            "kv_waste": waste.ratio, "preemptions": llm.engine.stats.preemptions}


class KvWasteMeter:
    """Allocated-but-unused KV slots / allocated slots, over all running sequences and steps."""

    def __init__(self, engine) -> None:
        self.engine, self.allocated, self.unused = engine, 0, 0

    def __call__(self, _record) -> None:
        size = self.engine.block_manager.block_size
        for seq in self.engine.scheduler.running:
            slots = len(seq.block_table) * size
            self.allocated += slots
            self.unused += slots - seq.num_computed_tokens

    @property
    def ratio(self) -> float:
        return self.unused / max(1, self.allocated)


def run_transformers(model: str, work, batch: int = 16, dtype: str = "float32") -> dict:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype)).eval()
    hf.generation_config.eos_token_id = None
    with torch.inference_mode():                                                   # warm-up, as the others
        hf.generate(torch.tensor([[11, 12, 13]]), max_new_tokens=4, do_sample=False, pad_token_id=0)
    start, tokens = time.perf_counter(), 0
    for i in range(0, len(work), batch):
        group = work[i:i + batch]
        width = max(len(p) for p, _ in group)
        ids = torch.tensor([[0] * (width - len(p)) + p for p, _ in group])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in group])
        with torch.inference_mode():
            hf.generate(ids, attention_mask=mask, max_new_tokens=max(o for _, o in group), do_sample=False,
                        pad_token_id=0)
        tokens += sum(o for _, o in group)                     # only the tokens each request asked for
    elapsed = time.perf_counter() - start
    return {"output_tokens": tokens, "seconds": elapsed, "tok_per_s": tokens / elapsed}


VLLM_SCRIPT = r"""
import json, sys, time
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
if __name__ == "__main__":
    model, work_file, dtype = sys.argv[1], sys.argv[2], sys.argv[3]
    work = json.load(open(work_file))
    llm = LLM(model=model, dtype=dtype, max_num_seqs=64, max_num_batched_tokens=2048, seed=0)
    llm.generate([TokensPrompt(prompt_token_ids=[11, 12, 13])], SamplingParams(max_tokens=4))
    params = [SamplingParams(temperature=0, max_tokens=o, ignore_eos=True) for _, o in work]
    start = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p, _ in work], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    print("RESULT " + json.dumps({"output_tokens": tokens, "seconds": elapsed, "tok_per_s": tokens / elapsed}))
"""


def run_vllm(python: str, model: str, work, threads: int, dtype: str = "float32") -> dict | None:
    if not Path(python).exists():
        return None
    tmp = RESULTS / "vllm_work.tmp"
    tmp.write_text(json.dumps(work))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": "0" if threads == 1 else f"0-{threads - 1}",
           "VLLM_CACHE_ROOT": "/tmp/vllm-cache", "TORCHINDUCTOR_CACHE_DIR": "/tmp/vllm-inductor"}
    iomp = Path(python).parent.parent / "lib" / "libiomp5.so"
    if iomp.exists():
        env["LD_PRELOAD"] = str(iomp)
    proc = subprocess.run([python, "-c", VLLM_SCRIPT, str(Path(model).resolve()), str(tmp.resolve()), dtype], env=env,
                          capture_output=True, text=True)
    tmp.unlink(missing_ok=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    print(proc.stderr[-3000:], file=sys.stderr)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--min-len", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=None,
                        help="every request's output length instead of one drawn like the prompt's (1: prefill only)")
    parser.add_argument("--json", type=Path, default=None, help="default: results/engine_throughput[_<model>].json")
    parser.add_argument("--vllm-python", default="/tmp/vllm-peer/bin/python")
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default=None, help="model folder or built-in name (default: the random Llama)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads; 1 avoids OpenMP stalls when other processes share the cores")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="every engine's dtype")
    args = parser.parse_args()
    import torch
    torch.set_num_threads(args.threads)

    from rich.console import Console
    from rich.table import Table

    console = Console()
    model, vocab_size, out_name = _model(args.model)
    work = workload(args.num_requests, args.min_len, args.max_len, vocab_size, output_len=args.output_len)
    engines = {"specfleet": lambda: run_specfleet(model, work, args.dtype)}
    if not args.skip_transformers:
        engines["transformers_static16"] = lambda: run_transformers(model, work, dtype=args.dtype)
    engines["vllm_cpu"] = lambda: run_vllm(args.vllm_python, model, work, args.threads, args.dtype)
    runs: dict[str, list[dict]] = {name: [] for name in engines}
    for repeat in range(args.repeats):
        for name, run in (list(engines.items()) if repeat % 2 == 0 else list(engines.items())[::-1]):
            with console.status(f"repeat {repeat + 1}/{args.repeats}: {name}"):
                result = run()
            if result is not None:
                runs[name].append(result)
    rates = {name: [r["tok_per_s"] for r in rs] for name, rs in runs.items() if rs}
    prompt_tokens = sum(len(p) for p, _ in work)
    prompt_rates = {name: [prompt_tokens / r["seconds"] for r in rs] for name, rs in runs.items() if rs}
    ours = statistics.median(rates["specfleet"])
    table = Table(title=f"{args.num_requests} requests, lengths {args.min_len}-{args.max_len}, greedy, {args.dtype}, "
                        f"{torch.get_num_threads()} threads, {args.repeats} alternating repeats")
    for col in ("engine", "output tok/s median (min-max)", "specfleet / engine"):
        table.add_column(col, justify="right")
    for name in engines:
        if name not in rates:
            table.add_row(name, "not installed", "-")
            continue
        r = rates[name]
        table.add_row(name, f"{statistics.median(r):.1f} ({min(r):.1f}-{max(r):.1f})",
                      f"{ours / statistics.median(r):.2f}x")
    console.print(table)
    waste = statistics.median(r["kv_waste"] for r in runs["specfleet"])
    console.print("prompt tok/s, median: " + ", ".join(
        f"{name} {statistics.median(r):.0f} ({min(r):.0f}-{max(r):.0f})" for name, r in prompt_rates.items()))
    console.print(f"KV waste (allocated but unused slots), median: {waste:.2%}")
    summary = {**stamp("benchmarks/engine_throughput.py", sys.argv[1:]),
               "model": args.model or MODEL_SHAPE, "workload": {**vars(args), "json": str(args.json)}, "runs": runs,
               "median_tok_per_s": {name: statistics.median(r) for name, r in rates.items()},
               "median_prompt_tok_per_s": {name: statistics.median(r) for name, r in prompt_rates.items()},
               "ratios": {name: ours / statistics.median(r) for name, r in rates.items() if name != "specfleet"}}
    RESULTS.mkdir(exist_ok=True)
    (args.json or RESULTS / out_name).write_text(json.dumps(summary, indent=2))


def _model(name: str | None) -> tuple[str, int, str]:
    """(folder, vocab size, results file) for --model, or the random Llama built once under benchmarks/."""
    from specfleet.engine.builtin import BUILTIN_MODELS, ensure_builtin
    from specfleet.engine.tiny_model import build_tiny_model

    if name is None:
        model = str(RESULTS.parent / ".cache" / "llama-512x4")
        if not Path(model, "config.json").exists():
            build_tiny_model(model, "llama", **MODEL_SHAPE)
        return model, MODEL_SHAPE["vocab_size"], "engine_throughput.json"
    folder = ensure_builtin(name) if name in BUILTIN_MODELS else Path(name)
    config = json.loads((folder / "config.json").read_text())
    return str(folder), config["vocab_size"], f"engine_throughput_{folder.name}.json"


if __name__ == "__main__":
    main()
