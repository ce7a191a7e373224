"""`specfleet bench serve`: an async load generator for any OpenAI-compatible server, like `vllm bench serve`.

Requests arrive as a Poisson process at `--request-rate` (or all at once with `inf`), optionally capped at
`--max-concurrency` in flight. Each one streams; the client times the first token (TTFT), the gaps between
chunks (ITL), the mean time per output token after the first (TPOT) and the whole request (E2E). Goodput
counts the requests per second that met every `--goodput` SLO.
"""
from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Optional

import typer

app = typer.Typer(no_args_is_help=True)

WORDS = ("the cluster scales pods when latency rises and speculation helps small batches while large batches "
         "prefer plain decoding because compute is shared across many sequences in one step").split()
SLO_KEYS = {"ttft", "tpot", "itl", "e2el"}


@dataclass
class BenchRequest:
    prompt: str
    max_tokens: int


@dataclass
class RequestResult:
    ok: bool
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    error: str = ""

    @property
    def tpot_s(self) -> float:
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1) if self.output_tokens > 1 else 0.0


# ---- workload ---------------------------------------------------------------------------------
def synthetic_requests(num: int, input_len: int, output_len: int, seed: int) -> list[BenchRequest]:
    """Prompts of about `input_len` words (roughly one token each) from a fixed vocabulary."""
    rng = random.Random(seed)
    return [BenchRequest(" ".join(rng.choice(WORDS) for _ in range(input_len)), output_len) for _ in range(num)]


def dataset_requests(path: str, num: int, output_len: int) -> list[BenchRequest]:
    """A JSONL file of {"prompt": str, "max_tokens"|"output_len": int (optional)}; cycled to `num`."""
    rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    if not rows:
        raise typer.BadParameter(f"{path} has no prompts")
    return [BenchRequest(str(row["prompt"]), int(row.get("max_tokens") or row.get("output_len") or output_len))
            for row in (rows[i % len(rows)] for i in range(num))]


def parse_goodput(items: list[str]) -> dict[str, float]:
    """["ttft:500", "itl:50"] or ["ttft:500 itl:50"] -> {"ttft": 0.5, "itl": 0.05} (seconds)."""
    slos = {}
    for item in (part for raw in items for part in raw.replace(",", " ").split()):
        key, _, value = item.partition(":")
        if key not in SLO_KEYS or not value:
            raise typer.BadParameter(f"--goodput takes KEY:MS with KEY in {sorted(SLO_KEYS)}, got {item!r}")
        slos[key] = float(value) / 1000.0
    return slos


def meets(result: RequestResult, slos: dict[str, float]) -> bool:
    observed = {"ttft": result.ttft_s, "tpot": result.tpot_s, "e2el": result.e2e_s,
                "itl": max(result.itl_s, default=0.0)}
    return result.ok and all(observed[key] <= limit for key, limit in slos.items())


# ---- the client -------------------------------------------------------------------------------
async def send(client, url: str, model: str, req: BenchRequest, chat: bool, api_key: str | None) -> RequestResult:
    body = {"model": model, "max_tokens": req.max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}
    body.update({"messages": [{"role": "user", "content": req.prompt}]} if chat else {"prompt": req.prompt})
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    result = RequestResult(ok=False)
    start = last = time.perf_counter()
    chunks = 0
    try:
        async with client.stream("POST", url, json=body, headers=headers) as resp:
            if resp.status_code != 200:
                result.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return result
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                payload = json.loads(data)
                if "error" in payload:
                    result.error = str(payload["error"])
                    return result
                if payload.get("usage"):
                    result.prompt_tokens = payload["usage"]["prompt_tokens"]
                    result.output_tokens = payload["usage"]["completion_tokens"]
                if not _has_text(payload):
                    continue
                now = time.perf_counter()
                if chunks == 0:
                    result.ttft_s = now - start
                else:
                    result.itl_s.append(now - last)
                last, chunks = now, chunks + 1
    except Exception as exc:           # noqa: BLE001 - a failed request is a result, not a crash
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.e2e_s = time.perf_counter() - start
    result.output_tokens = result.output_tokens or chunks
    result.ok = True
    return result


def _has_text(payload: dict) -> bool:
    for choice in payload.get("choices") or []:
        if choice.get("text") or (choice.get("delta") or {}).get("content"):
            return True
    return False


async def run_load(base_url: str, model: str, requests: list[BenchRequest], rate: float, concurrency: int | None,
                   chat: bool, api_key: str | None, seed: int, on_done=None) -> tuple[list[RequestResult], float]:
    import httpx

    url = base_url.rstrip("/") + ("/v1/chat/completions" if chat else "/v1/completions")
    limit = asyncio.Semaphore(concurrency or len(requests) or 1)
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=concurrency or len(requests) or 1, max_keepalive_connections=64)

    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=30.0), limits=limits) as client:
        async def one(req: BenchRequest) -> RequestResult:
            async with limit:
                result = await send(client, url, model, req, chat, api_key)
            if on_done:
                on_done(result)
            return result

        start = time.perf_counter()
        tasks = []
        for req in requests:
            tasks.append(asyncio.create_task(one(req)))
            if rate != float("inf"):
                await asyncio.sleep(rng.expovariate(rate))
        results = await asyncio.gather(*tasks)
    return list(results), time.perf_counter() - start


# ---- the report -------------------------------------------------------------------------------
def _stats_ms(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p99": 0.0}
    ordered = sorted(values)

    def pct(q: float) -> float:          # linear interpolation, as numpy.percentile
        pos = q / 100 * (len(ordered) - 1)
        low = int(pos)
        high = min(low + 1, len(ordered) - 1)
        return (ordered[low] + (ordered[high] - ordered[low]) * (pos - low)) * 1000

    return {"mean": statistics.fmean(values) * 1000, "p50": pct(50), "p99": pct(99)}


def summarize(results: list[RequestResult], duration_s: float, slos: dict[str, float]) -> dict:
    done = [r for r in results if r.ok]
    output_tokens = sum(r.output_tokens for r in done)
    summary = {
        "completed": len(done), "failed": len(results) - len(done), "duration_s": duration_s,
        "total_input_tokens": sum(r.prompt_tokens for r in done), "total_output_tokens": output_tokens,
        "request_throughput": len(done) / duration_s if duration_s else 0.0,
        "output_throughput": output_tokens / duration_s if duration_s else 0.0,
        "ttft_ms": _stats_ms([r.ttft_s for r in done]),
        "tpot_ms": _stats_ms([r.tpot_s for r in done if r.output_tokens > 1]),
        "itl_ms": _stats_ms([gap for r in done for gap in r.itl_s]),
        "e2el_ms": _stats_ms([r.e2e_s for r in done]),
        "errors": sorted({r.error for r in results if not r.ok})[:10],
    }
    if slos:
        good = sum(1 for r in done if meets(r, slos))
        summary["goodput"] = {"slos_ms": {k: v * 1000 for k, v in slos.items()}, "good_requests": good,
                              "request_goodput": good / duration_s if duration_s else 0.0}
    return summary


def print_report(summary: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Serving benchmark", show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in ("completed", "failed", "total_input_tokens", "total_output_tokens"):
        table.add_row(key.replace("_", " "), str(summary[key]))
    table.add_row("duration (s)", f"{summary['duration_s']:.2f}")
    table.add_row("request throughput (req/s)", f"{summary['request_throughput']:.2f}")
    table.add_row("output throughput (tok/s)", f"{summary['output_throughput']:.1f}")
    if "goodput" in summary:
        table.add_row("goodput (req/s)", f"{summary['goodput']['request_goodput']:.2f}")
    for name in ("ttft", "tpot", "itl", "e2el"):
        stats = summary[f"{name}_ms"]
        table.add_row(f"{name.upper()} mean / p50 / p99 (ms)",
                      f"{stats['mean']:.1f} / {stats['p50']:.1f} / {stats['p99']:.1f}")
    console = Console()
    console.print(table)
    for error in summary["errors"]:
        console.print(f"[red]error:[/] {error}")


@app.command()
def serve(
    base_url: str = typer.Option("http://127.0.0.1:8000", help="Server root (without /v1)."),
    model: str = typer.Option(..., help="Served model name."),
    num_prompts: int = typer.Option(100, help="Requests to send."),
    request_rate: str = typer.Option("inf", help="Requests per second (Poisson arrivals), or inf."),
    max_concurrency: Optional[int] = typer.Option(None, help="Most requests in flight at once."),
    input_len: int = typer.Option(128, help="Synthetic prompt length (about one token per word)."),
    output_len: int = typer.Option(64, help="Output tokens per request (ignore_eos is set)."),
    dataset: Optional[str] = typer.Option(None, help="JSONL prompts: {\"prompt\": ..., \"max_tokens\": ...}."),
    endpoint: str = typer.Option("completions", help="completions or chat."),
    goodput: list[str] = typer.Option([], help="SLOs as KEY:MS (ttft, tpot, itl, e2el); repeatable."),
    api_key: Optional[str] = typer.Option(None, envvar="OPENAI_API_KEY", help="Bearer token, if any."),
    seed: int = typer.Option(0, help="Seed for prompts and arrival times."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the results to this JSON file."),
) -> None:
    """Load-test an OpenAI-compatible server and report TTFT, TPOT, ITL, E2E, throughput and goodput."""
    from rich.progress import Progress

    rate = float(request_rate)
    if rate <= 0:
        raise typer.BadParameter("--request-rate must be > 0 or inf")
    if endpoint not in ("completions", "chat"):
        raise typer.BadParameter("--endpoint is completions or chat")
    slos = parse_goodput(goodput)
    requests = (dataset_requests(dataset, num_prompts, output_len) if dataset
                else synthetic_requests(num_prompts, input_len, output_len, seed))
    with Progress(transient=True) as progress:
        task = progress.add_task("requests", total=len(requests))
        results, duration = asyncio.run(run_load(base_url, model, requests, rate, max_concurrency,
                                                 endpoint == "chat", api_key, seed,
                                                 lambda _: progress.advance(task)))
    summary = summarize(results, duration, slos)
    summary["config"] = {"base_url": base_url, "model": model, "num_prompts": num_prompts,
                         "request_rate": request_rate, "max_concurrency": max_concurrency, "input_len": input_len,
                         "output_len": output_len, "dataset": dataset, "endpoint": endpoint}
    print_report(summary)
    if json_out:
        per_request = [{**asdict(r), "tpot_s": r.tpot_s} for r in results]
        with open(json_out, "w", encoding="utf-8") as fh:
            json.dump({**summary, "requests": per_request}, fh, indent=2)
    if summary["completed"] == 0:
        raise typer.Exit(1)
