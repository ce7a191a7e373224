"""`specfleet bench serve`: load-test any OpenAI-compatible server, like `vllm bench serve`.

It takes vLLM's workload knobs (`--dataset-name random --random-input-len --random-output-len
--num-prompts --max-concurrency --request-rate --ignore-eos --endpoint`), so one command line drives
either server. The load generator itself (arrivals, streaming client, timings, report) is
`specfleet.cluster.loadgen`, which the serving benchmarks share; this module maps options onto it.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from typing import Optional

import typer

from specfleet.cluster.loadgen import (BenchRequest, LoadTarget, dataset_requests, endpoint_path, load_tokenizer,
                                       parse_goodput, print_report, random_requests, run_load, summarize,
                                       synthetic_requests)

app = typer.Typer(no_args_is_help=True)


# ---- the command ------------------------------------------------------------------------------
def build_requests(dataset_name: str, dataset_path: str | None, tokenizer_name: str, num_prompts: int,
                   input_len: int, output_len: int, range_ratio: float, seed: int) -> list[BenchRequest]:
    if dataset_path or dataset_name == "jsonl":
        if not dataset_path:
            raise typer.BadParameter("--dataset-name jsonl needs --dataset-path")
        return dataset_requests(dataset_path, num_prompts, output_len)
    if dataset_name == "words":
        return synthetic_requests(num_prompts, input_len, output_len, seed)
    if dataset_name != "random":
        raise typer.BadParameter("--dataset-name is random, words or jsonl")
    tokenizer = load_tokenizer(tokenizer_name)
    if tokenizer is None:
        typer.echo(f"no tokenizer at {tokenizer_name!r} (pass --tokenizer DIR): prompts are words", err=True)
        return synthetic_requests(num_prompts, input_len, output_len, seed)
    return random_requests(tokenizer, num_prompts, input_len, output_len, range_ratio, seed)


@app.command()
def serve(
    base_url: str = typer.Option("http://127.0.0.1:8000", help="Server root (without /v1)."),
    model: str = typer.Option(..., help="Served model name."),
    tokenizer: Optional[str] = typer.Option(None, help="Tokenizer folder or built-in model (default: --model)."),
    num_prompts: int = typer.Option(100, help="Requests to send."),
    request_rate: str = typer.Option("inf", help="Requests per second (Poisson arrivals), or inf."),
    max_concurrency: Optional[int] = typer.Option(None, help="Most requests in flight at once."),
    dataset_name: str = typer.Option("random", help="random (token ids, as vLLM), words, or jsonl."),
    dataset_path: Optional[str] = typer.Option(None, "--dataset-path", "--dataset",
                                               help="JSONL prompts: {\"prompt\": ..., \"max_tokens\": ...}."),
    input_len: int = typer.Option(128, "--random-input-len", "--input-len", help="Prompt tokens per request."),
    output_len: int = typer.Option(64, "--random-output-len", "--output-len", help="Output tokens per request."),
    range_ratio: float = typer.Option(0.0, "--random-range-ratio", help="Lengths vary uniformly by ± this share."),
    ignore_eos: bool = typer.Option(True, "--ignore-eos/--no-ignore-eos", help="Generate the full output length."),
    temperature: float = typer.Option(0.0, help="Sampling temperature (0: greedy)."),
    endpoint: str = typer.Option("completions", help="completions, chat, or vLLM's /v1/... path."),
    backend: Optional[str] = typer.Option(None, help="vLLM's backend name; openai-chat selects chat."),
    goodput: list[str] = typer.Option([], help="SLOs as KEY:MS (ttft, tpot, itl, e2el); repeatable."),
    api_key: Optional[str] = typer.Option(None, envvar="OPENAI_API_KEY", help="Bearer token, if any."),
    seed: int = typer.Option(0, help="Seed for prompts and arrival times."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the results to this JSON file."),
) -> None:
    """Load-test an OpenAI-compatible server and report TTFT, TPOT, ITL, E2E, throughput and goodput."""
    from rich.progress import Progress

    try:
        rate = float(request_rate)
        if rate <= 0:
            raise ValueError("--request-rate must be > 0 or inf")
        target = LoadTarget(base_url, model, endpoint_path(endpoint, backend), api_key, ignore_eos, temperature)
        slos = parse_goodput(goodput)
        requests = build_requests(dataset_name, dataset_path, tokenizer or model, num_prompts, input_len,
                                  output_len, range_ratio, seed)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    with Progress(transient=True) as progress:
        task = progress.add_task("requests", total=len(requests))
        results, duration = asyncio.run(run_load(target, requests, rate, max_concurrency, seed,
                                                 lambda _: progress.advance(task)))
    summary = summarize(results, duration, slos)
    summary["config"] = {"base_url": base_url, "model": model, "num_prompts": num_prompts,
                         "request_rate": request_rate, "max_concurrency": max_concurrency,
                         "dataset_name": dataset_name, "input_len": input_len, "output_len": output_len,
                         "dataset_path": dataset_path, "endpoint": target.endpoint, "ignore_eos": ignore_eos}
    print_report(summary)
    if json_out:
        per_request = [{**asdict(r), "tpot_s": r.tpot_s} for r in results]
        with open(json_out, "w", encoding="utf-8") as fh:
            json.dump({**summary, "requests": per_request}, fh, indent=2)
    if summary["completed"] == 0:
        raise typer.Exit(1)
