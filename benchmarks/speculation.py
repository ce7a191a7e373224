"""Speculative decoding on real weights (SmolLM2-135M-Instruct): speed-up vs batch size.

Workloads: copy-heavy (repeat or lightly edit code given in the prompt) and open-ended (stories,
explanations). For each batch size, the same engine runs the same requests with speculation off and
on (toggled live, alternating, in one process), and reports tokens/s, acceptance rate alpha, mean
accepted length, the speed-up, and the Leviathan et al. prediction
(1 - alpha^(k+1)) / ((1 - alpha) (k c + 1)), c being the draft's cost per token relative to the target.
Writes benchmarks/results/speculation.json (the operator's performance model can read it as priors).

    python benchmarks/speculation.py [--batches 1 4 16 64] [--max-tokens 64] [--methods ngram draft]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"

CODE = '''def merge_sorted(a: list[int], b: list[int]) -> list[int]:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            out.append(a[i]); i += 1
        else:
            out.append(b[j]); j += 1
    return out + a[i:] + b[j:]
'''
COPY_TASKS = [
    f"Repeat the following Python code exactly, without any comment:\n\n{CODE}",
    f"Rename the function merge_sorted to merge in this code and print the whole code:\n\n{CODE}",
    "Copy this text word for word: The operator reconciles each InferenceService into a Deployment, "
    "a Service and a PodDisruptionBudget, and it sizes the KV cache from the declared latency targets.",
    f"Add type hints where missing and repeat the code:\n\n{CODE}",
]
OPEN_TASKS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain why the sky is blue to a ten-year-old.",
    "Give me five ideas for a birthday party for a friend who loves astronomy.",
    "What are the pros and cons of working from home?",
]


def chat(tokenizer, text: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)


def timed_generate(llm, prompts, params) -> tuple[float, int, dict]:
    stats = llm.engine.stats
    before = (stats.spec_draft_tokens, stats.spec_accepted_tokens, stats.spec_drafts)
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    drafted = stats.spec_draft_tokens - before[0]
    accepted = stats.spec_accepted_tokens - before[1]
    drafts = stats.spec_drafts - before[2]
    return elapsed, sum(len(o.token_ids) for o in outs), {"drafted": drafted, "accepted": accepted, "drafts": drafts}


def leviathan(alpha: float, k: int, c: float) -> float:
    if alpha >= 1.0:
        return (k + 1) / (k * c + 1)
    return (1 - alpha ** (k + 1)) / ((1 - alpha) * (k * c + 1))


def measure(llm, tasks, batch: int, k: int, max_tokens: int, c: float, repeats: int) -> dict:
    from specfleet.engine import SamplingParams

    prompts = [chat(llm.tokenizer, tasks[i % len(tasks)]) for i in range(batch)]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    off_s = on_s = 0.0
    tokens = 0
    spec = {"drafted": 0, "accepted": 0, "drafts": 0}
    for _ in range(repeats):                                           # alternate off / on
        llm.set_speculation(enabled=False)
        t, n, _ = timed_generate(llm, prompts, params)
        off_s, tokens = off_s + t, tokens + n
        llm.set_speculation(enabled=True, num_speculative_tokens=k)
        t, _, s = timed_generate(llm, prompts, params)
        on_s += t
        spec = {key: spec[key] + s[key] for key in spec}
    alpha = spec["accepted"] / max(1, spec["drafted"])
    return {"batch": batch, "k": k, "tok_per_s_off": tokens / off_s, "tok_per_s_on": tokens / on_s,
            "speedup": off_s / on_s, "acceptance_rate": alpha,
            "mean_accepted_length": 1 + spec["accepted"] / max(1, spec["drafts"]),
            "predicted_speedup": leviathan(alpha, k, c), "draft_cost_ratio": c}


def draft_cost_ratio(target_layers: int, draft_layers: int) -> float:
    return draft_layers / target_layers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--methods", nargs="+", default=["ngram", "draft"])
    parser.add_argument("--draft-layers", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads; 1 avoids OpenMP stalls when other processes share the cores")
    args = parser.parse_args()
    import torch
    torch.set_num_threads(args.threads)

    from rich.console import Console
    from rich.table import Table

    from specfleet.engine import LLM
    from specfleet.engine.builtin import cache_dir, ensure_builtin
    from specfleet.engine.speculative.draft import make_truncated_draft

    console = Console()
    target = ensure_builtin("smollm2-135m")
    draft_dir = cache_dir() / f"smollm2-135m-first{args.draft_layers}"
    if "draft" in args.methods and not (draft_dir / "config.json").exists():
        make_truncated_draft(target, draft_dir, args.draft_layers)
    rows = []
    for method in args.methods:
        extra = {"draft_model": str(draft_dir)} if method == "draft" else {}
        llm = LLM(str(target), speculative_method=method, num_speculative_tokens=args.k, num_kv_blocks=4096,
                  max_num_seqs=max(args.batches), **extra)
        c = draft_cost_ratio(30, args.draft_layers) if method == "draft" else 0.0
        for workload, tasks in (("copy-heavy", COPY_TASKS), ("open-ended", OPEN_TASKS)):
            for batch in args.batches:
                with console.status(f"{method} {workload} batch {batch}"):
                    r = measure(llm, tasks, batch, args.k, args.max_tokens, c, args.repeats)
                rows.append({"method": method, "workload": workload, **r})
                console.print(f"{method:5} {workload:10} B={batch:<3} off {r['tok_per_s_off']:7.1f} tok/s  "
                              f"on {r['tok_per_s_on']:7.1f} tok/s  x{r['speedup']:.2f}  "
                              f"alpha {r['acceptance_rate']:.2f}  predicted x{r['predicted_speedup']:.2f}")
        del llm
    table = Table(title=f"Speculative decoding, SmolLM2-135M fp32 on CPU, k={args.k}, {args.max_tokens} tokens/request")
    for col in ("method", "workload", "batch", "off tok/s", "on tok/s", "speed-up", "alpha", "mean accepted",
                "predicted", "measured/predicted"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["method"], r["workload"], str(r["batch"]), f"{r['tok_per_s_off']:.1f}",
                      f"{r['tok_per_s_on']:.1f}", f"{r['speedup']:.2f}x", f"{r['acceptance_rate']:.2f}",
                      f"{r['mean_accepted_length']:.2f}", f"{r['predicted_speedup']:.2f}x",
                      f"{r['speedup'] / r['predicted_speedup']:.0%}")
    console.print(table)
    stops = {f"{m}/{w}": next((r["batch"] for r in rows if r["method"] == m and r["workload"] == w
                               and r["speedup"] < 1.0), None)
             for m in args.methods for w in ("copy-heavy", "open-ended")}
    console.print(f"batch size where speculation stops paying: {stops}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "speculation.json").write_text(json.dumps({"args": vars(args), "rows": rows,
                                                          "stops_paying_at_batch": stops}, indent=2))


if __name__ == "__main__":
    main()
