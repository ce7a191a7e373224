"""Step by step under the same arrivals: how our server and `vllm serve` pack and time their engine steps.

Both servers run on the real SmolLM2-135M as in benchmarks/serving.py, each logging its steps: ours with
`--log-steps FILE` (one JSON line per step), vLLM with `--enable-logging-iteration-details` (one log line
per iteration: context requests and tokens, generation requests, elapsed ms). One client
(`specfleet bench serve`'s, vLLM's random workload) drives each server in turn at one concurrency,
repeats alternating which goes first; each run's steps are the lines its log gained during it. Per run:
decode-only steps (median ms by batch), mixed steps (prompt tokens and ms, in order), the sums, and the
client's throughput, TTFT and TPOT. The table gives the median and min-max over repeats, ours / vLLM.

    .venv/bin/python benchmarks/serving_steps.py [--concurrency 32] [--repeats 3] [--dtype float32|bfloat16]
        [--json results/serving_steps.json]
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
from pathlib import Path

from serving import NAME, RESULTS, Contender, one_run, start_specfleet, start_vllm, wait_ready

ITERATION = re.compile(r"Iteration\(\d+\): (\d+) context requests, (\d+) context tokens, (\d+) generation requests, "
                       r"\d+ generation tokens, iteration elapsed time: ([\d.]+) ms")


def ours_steps(text: str) -> list[dict]:
    return [{"ms": r["duration_s"] * 1e3, "seqs": r["num_seqs"], "prompt_tokens": r["num_prefill_tokens"]}
            for r in map(json.loads, text.splitlines()) if r]


def vllm_steps(text: str) -> list[dict]:
    return [{"ms": float(ms), "seqs": int(ctx) + int(gen), "prompt_tokens": int(tokens)}
            for ctx, tokens, gen, ms in ITERATION.findall(text)]


def summarize_steps(steps: list[dict], batch: int) -> dict:
    decode = [s["ms"] for s in steps if not s["prompt_tokens"]]
    full = [s["ms"] for s in steps if not s["prompt_tokens"] and s["seqs"] == batch]
    mixed = [s for s in steps if s["prompt_tokens"]]
    return {"steps": len(steps), "decode_steps": len(decode), "decode_s": sum(decode) / 1e3,
            "decode_full_batch_ms": statistics.median(full) if full else None,
            "mixed_steps": len(mixed), "mixed_s": sum(s["ms"] for s in mixed) / 1e3,
            "prompt_tokens": sum(s["prompt_tokens"] for s in mixed),
            "mixed_ms_per_prompt_token": sum(s["ms"] for s in mixed) / max(1, sum(s["prompt_tokens"] for s in mixed)),
            "mixed": [(s["seqs"], s["prompt_tokens"], round(s["ms"])) for s in mixed]}


class Traced:
    """A started contender and the file its steps go to; `new_steps` parses what the log gained."""

    def __init__(self, contender: Contender, log: Path, parse) -> None:
        self.contender, self.log, self.parse, self.offset = contender, log, parse, 0

    def mark(self) -> None:
        self.offset = self.log.stat().st_size if self.log.exists() else 0

    def new_steps(self) -> list[dict]:
        with open(self.log, encoding="utf-8", errors="replace") as f:
            f.seek(self.offset)
            return self.parse(f.read())


def start_both(model: str, vllm: Path, logdir: Path, dtype: str = "float32") -> list[Traced]:
    steps = logdir / "specfleet-steps.jsonl"
    ours = Traced(start_specfleet(model, logdir, ("--log-steps", str(steps)), dtype), steps, ours_steps)
    peer = start_vllm(vllm, model, logdir, ("--enable-logging-iteration-details",), dtype)
    return [ours, Traced(peer, peer.log, vllm_steps)]


def measure(traced: Traced, requests, concurrency: int) -> dict:
    traced.mark()
    client = one_run(traced.contender, "completions", requests, concurrency)
    row = summarize_steps(traced.new_steps(), concurrency)
    return row | {"output_throughput": client["output_throughput"], "ttft_p50": client["ttft_ms"]["p50"],
                  "tpot_p50": client["tpot_ms"]["p50"], "failed": client["failed"]}


def fold(runs: list[dict], key: str) -> dict:
    values = [r[key] for r in runs if r[key] is not None]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)} if values else {}


KEYS = ("output_throughput", "ttft_p50", "tpot_p50", "decode_full_batch_ms", "decode_s", "mixed_s",
        "mixed_ms_per_prompt_token", "steps")


def print_table(runs: dict[str, list[dict]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Engine steps under the same client: median (min-max) over repeats")
    for column in ("measure", *runs, "ours/vLLM"):
        table.add_column(column, justify="right")
    for key in KEYS:
        folded = {name: fold(r, key) for name, r in runs.items()}
        cells = [f"{f['median']:.2f} ({f['min']:.2f}-{f['max']:.2f})" if f else "-" for f in folded.values()]
        ours, peer = folded.get("specfleet"), folded.get("vllm")
        ratio = f"{ours['median'] / peer['median']:.2f}" if ours and peer and peer["median"] else ""
        table.add_row(key, *cells, ratio)
    Console().print(table)


def main() -> None:
    from specfleet.cli.bench_cmds import load_tokenizer, random_requests
    from specfleet.engine.builtin import ensure_builtin

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--random-input-len", type=int, default=256)
    parser.add_argument("--random-output-len", type=int, default=128)
    parser.add_argument("--prompts-per-slot", type=int, default=2)
    parser.add_argument("--vllm", type=Path, default=Path("/tmp/vllm-peer"))
    parser.add_argument("--json", type=Path, default=RESULTS / "serving_steps.json")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="both servers' dtype")
    args = parser.parse_args()

    model = str(ensure_builtin(NAME))
    tokenizer = load_tokenizer(model)
    logdir = Path(tempfile.mkdtemp(prefix="serving-steps-"))
    contenders = start_both(model, args.vllm, logdir, args.dtype)
    runs: dict[str, list[dict]] = {t.contender.name: [] for t in contenders}
    try:
        for t in contenders:
            wait_ready(t.contender, 600)
            warm = random_requests(tokenizer, args.concurrency, args.random_input_len, args.random_output_len, 0.0, 999)
            one_run(t.contender, "completions", warm, args.concurrency)
        for repeat in range(args.repeats):
            requests = random_requests(tokenizer, args.prompts_per_slot * args.concurrency, args.random_input_len,
                                       args.random_output_len, 0.0, repeat)
            for t in contenders if repeat % 2 == 0 else contenders[::-1]:
                runs[t.contender.name].append(measure(t, requests, args.concurrency))
                row = runs[t.contender.name][-1]
                print(f"repeat {repeat} {t.contender.name}: {row['output_throughput']:.1f} tok/s, decode at "
                      f"batch {args.concurrency} {row['decode_full_batch_ms']} ms, mixed {row['mixed_s']:.2f} s",
                      flush=True)
    finally:
        for t in contenders:
            t.contender.stop()
    print_table(runs)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"config": {k: str(v) for k, v in vars(args).items()}, "runs": runs}, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
