"""What the HTTP path adds to a request: client-side latency against the server's own, for our server and vLLM.

Both servers export vLLM's `vllm:time_to_first_token_seconds` and `vllm:e2e_request_latency_seconds`
histograms, timed from when the server takes the request in. `specfleet bench serve`'s client times the
same requests from when it sends them (vLLM's random workload, streaming, greedy, `ignore_eos`). The
difference of the means is what lies outside the server's clock: reading and parsing the request before
the handler runs, and writing the tokens out after the engine made them. Each (repeat, concurrency)
scrapes /metrics before and after its run and draws prompts of its own; servers alternate which goes
first. Reports, per server and concurrency, the median over repeats of the mean gap on the first token
and on the whole request, with the range.

    .venv/bin/python benchmarks/serving_gaps.py [--concurrency 1 8 32] [--repeats 3] [--no-vllm]
        [--endpoint completions|chat] [--dtype float32|bfloat16] [--json benchmarks/results/serving_gaps.json]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import tempfile
from pathlib import Path

import serving   # benchmarks/serving.py: the servers, as the serving benchmark starts them

from specfleet.operator.control.window import Histogram

RESULTS = Path(__file__).parent / "results"
HISTOGRAMS = ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds")
FIGURES = ("ttft_gap_ms", "e2e_gap_ms", "client_ttft_ms", "server_ttft_ms")


def server_histograms(base_url: str) -> dict[str, Histogram]:
    """Each of HISTOGRAMS from /metrics, summed over its label sets (vLLM labels its engine)."""
    import httpx

    from specfleet.operator.control.window import parse_labels
    from specfleet.operator.metrics_source import parse_exposition

    scrape = parse_exposition(httpx.get(f"{base_url}/metrics", timeout=10).text, 0.0)
    out = {}
    for name in HISTOGRAMS:
        parts = [h for key, h in scrape.histograms.items() if parse_labels(key)[0] == name]
        out[name] = Histogram(parts[0].bounds, tuple(map(sum, zip(*(h.counts for h in parts)))),
                              sum(h.sum for h in parts))
    return out


def one_run(c: serving.Contender, requests, concurrency: int, endpoint: str = "completions") -> dict:
    from specfleet.cli.bench_cmds import LoadTarget, run_load

    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    before = server_histograms(c.base_url)
    results, _ = asyncio.run(run_load(LoadTarget(c.base_url, serving.NAME, path), requests, float("inf"),
                                      concurrency, seed=0))
    after = server_histograms(c.base_url)
    served = {name: after[name].minus(before[name]) for name in HISTOGRAMS}
    server_ttft, server_e2e = (served[name].sum / served[name].count * 1e3 for name in HISTOGRAMS)
    client_ttft = statistics.mean(r.ttft_s for r in results) * 1e3
    client_e2e = statistics.mean(r.e2e_s for r in results) * 1e3
    return {"requests": len(results), "failed": sum(not r.ok for r in results), "client_ttft_ms": client_ttft,
            "server_ttft_ms": server_ttft, "client_e2e_ms": client_e2e, "server_e2e_ms": server_e2e,
            "ttft_gap_ms": client_ttft - server_ttft, "e2e_gap_ms": client_e2e - server_e2e}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--random-input-len", type=int, default=256)
    parser.add_argument("--random-output-len", type=int, default=64)
    parser.add_argument("--prompts-per-slot", type=int, default=2)
    parser.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="both servers'")
    parser.add_argument("--vllm", type=Path, default=Path("/tmp/vllm-peer"))
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument("--json", type=Path, default=RESULTS / "serving_gaps.json")
    args = parser.parse_args()
    from rich.console import Console
    from rich.table import Table

    from specfleet.cli.bench_cmds import load_tokenizer, random_requests
    from specfleet.engine.builtin import ensure_builtin

    console, model = Console(), str(ensure_builtin(serving.NAME))
    logdir = Path(tempfile.mkdtemp(prefix="serving-gaps-"))
    contenders = [serving.start_specfleet(model, logdir, dtype=args.dtype)]
    if not args.no_vllm and (args.vllm / "bin" / "python").exists():
        contenders.append(serving.start_vllm(args.vllm, model, logdir, dtype=args.dtype))
    runs: dict[str, list[dict]] = {}
    try:
        for c in contenders:
            serving.wait_ready(c, 600)
        tokenizer = load_tokenizer(model)
        for repeat in range(args.repeats):
            for concurrency in args.concurrency:
                requests = random_requests(tokenizer, args.prompts_per_slot * concurrency, args.random_input_len,
                                           args.random_output_len, 0.0, seed=1000 * repeat + concurrency)
                for c in (contenders if repeat % 2 == 0 else contenders[::-1]):
                    run = one_run(c, requests, concurrency, args.endpoint)
                    runs.setdefault(f"{c.name}@{concurrency}", []).append(run)
                    console.print(f"repeat {repeat} c={concurrency} {c.name}: first-token gap "
                                  f"{run['ttft_gap_ms']:.0f} ms, whole-request gap {run['e2e_gap_ms']:.0f} ms")
    finally:
        for c in contenders:
            c.stop()
    table = Table(title=f"client-side minus server-side latency, mean per run, ms: median (min-max) over "
                        f"{args.repeats} repeats")
    for column in ("server", "conc.", "first token", "whole request", "client TTFT", "server TTFT", "failed"):
        table.add_column(column, justify="right")
    summary = {key: serving.aggregate(rs, FIGURES) for key, rs in runs.items()}
    for key, s in summary.items():
        name, concurrency = key.split("@")
        table.add_row(name, concurrency, *(f"{s[m]['median']:.0f} ({s[m]['min']:.0f}-{s[m]['max']:.0f})"
                                           for m in ("ttft_gap_ms", "e2e_gap_ms")),
                      f"{s['client_ttft_ms']['median']:.0f}", f"{s['server_ttft_ms']['median']:.0f}", str(s["failed"]))
    console.print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"config": vars(args) | {"vllm": str(args.vllm), "json": str(args.json)},
                                     "summary": summary, "runs": runs}, indent=2) + "\n")
    console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
