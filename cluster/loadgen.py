"""The load generator: an async client for any OpenAI-compatible server, like `vllm bench serve`'s.

`specfleet bench serve` (cli/bench_cmds.py) and the serving benchmarks (benchmarks/serving.py, lora.py,
bench_serve_smoke.py) drive a server with it. Requests arrive as a Poisson process at a rate (or all at
once with `inf`), optionally capped at a concurrency. Each one streams; the client times the first token
(TTFT), the gaps between chunks (ITL), the mean time per output token after the first (TPOT) and the whole
request (E2E), as vLLM's client does. Goodput counts the requests per second that met every SLO.

The random dataset follows vLLM's: each prompt is `input_len` random token ids of the model's tokenizer
(uniform in [len·(1−r), len·(1+r)] with range ratio r), sent as text. Without a tokenizer, prompts are
words from a fixed vocabulary (about one token each). Bad arguments raise ValueError.
"""
from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

WORDS = ("the cluster scales pods when latency rises and speculation helps small batches while large batches "
         "prefer plain decoding because compute is shared across many sequences in one step").split()
SLO_KEYS = {"ttft", "tpot", "itl", "e2el"}
ENDPOINTS = {"completions": "/v1/completions", "/v1/completions": "/v1/completions",
             "chat": "/v1/chat/completions", "/v1/chat/completions": "/v1/chat/completions"}


@dataclass
class BenchRequest:
    prompt: str
    max_tokens: int
    prompt_len: int = 0          # tokens, when the workload knows it (0: unknown)


@dataclass(frozen=True)
class LoadTarget:
    """Where and how requests go: the same body whichever server answers."""
    base_url: str
    model: str
    endpoint: str = "/v1/completions"       # or /v1/chat/completions
    api_key: str | None = None
    ignore_eos: bool = True
    temperature: float = 0.0

    @property
    def chat(self) -> bool:
        return self.endpoint.endswith("/chat/completions")

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + self.endpoint

    def body(self, req: BenchRequest) -> dict:
        body = {"model": self.model, "temperature": self.temperature, "stream": True,
                "stream_options": {"include_usage": True}, "ignore_eos": self.ignore_eos}
        if self.chat:
            body.update(messages=[{"role": "user", "content": req.prompt}], max_completion_tokens=req.max_tokens)
        else:
            body.update(prompt=req.prompt, max_tokens=req.max_tokens)
        return body


@dataclass
class RequestResult:
    ok: bool
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    text: str = ""
    error: str = ""

    @property
    def tpot_s(self) -> float:
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1) if self.output_tokens > 1 else 0.0


# ---- workload ---------------------------------------------------------------------------------
def synthetic_requests(num: int, input_len: int, output_len: int, seed: int) -> list[BenchRequest]:
    """Prompts of about `input_len` words (roughly one token each) from a fixed vocabulary."""
    rng = random.Random(seed)
    return [BenchRequest(" ".join(rng.choice(WORDS) for _ in range(input_len)), output_len) for _ in range(num)]


def random_requests(tokenizer, num: int, input_len: int, output_len: int, range_ratio: float,
                    seed: int) -> list[BenchRequest]:
    """vLLM's random dataset: random non-special token ids, decoded to text, re-encoded and cut to length
    (so the prompt the server tokenizes is about `input_len` tokens); output lengths vary the same way."""
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError("--random-range-ratio must be in [0, 1)")
    rng = random.Random(seed)
    special = set(tokenizer.all_special_ids)
    vocab = [t for t in range(len(tokenizer)) if t not in special]
    requests = []
    for _ in range(num):
        n_in = _around(rng, input_len, range_ratio)
        ids = [rng.choice(vocab) for _ in range(n_in)]
        ids = tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False)[:n_in]
        requests.append(BenchRequest(tokenizer.decode(ids), _around(rng, output_len, range_ratio), len(ids)))
    return requests


def _around(rng: random.Random, n: int, ratio: float) -> int:
    return max(1, rng.randint(int(n * (1 - ratio)), int(n * (1 + ratio)))) if ratio else n


def load_tokenizer(name: str):
    """A Hugging Face tokenizer from a folder or a built-in model name; None when there is none."""
    from specfleet.engine.builtin import BUILTIN_MODELS, ensure_builtin

    path = str(ensure_builtin(name)) if name in BUILTIN_MODELS else name
    if not Path(path).is_dir():
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def dataset_requests(path: str, num: int, output_len: int) -> list[BenchRequest]:
    """A JSONL file of {"prompt": str, "max_tokens"|"output_len": int (optional)}; cycled to `num`."""
    rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    if not rows:
        raise ValueError(f"{path} has no prompts")
    return [BenchRequest(str(row["prompt"]), int(row.get("max_tokens") or row.get("output_len") or output_len))
            for row in (rows[i % len(rows)] for i in range(num))]


def parse_goodput(items: list[str]) -> dict[str, float]:
    """["ttft:500", "itl:50"] or ["ttft:500 itl:50"] -> {"ttft": 0.5, "itl": 0.05} (seconds)."""
    slos = {}
    for item in (part for raw in items for part in raw.replace(",", " ").split()):
        key, _, value = item.partition(":")
        if key not in SLO_KEYS or not value:
            raise ValueError(f"--goodput takes KEY:MS with KEY in {sorted(SLO_KEYS)}, got {item!r}")
        slos[key] = float(value) / 1000.0
    return slos


def meets(result: RequestResult, slos: dict[str, float]) -> bool:
    observed = {"ttft": result.ttft_s, "tpot": result.tpot_s, "e2el": result.e2e_s,
                "itl": max(result.itl_s, default=0.0)}
    return result.ok and all(observed[key] <= limit for key, limit in slos.items())


# ---- the client -------------------------------------------------------------------------------
async def send(client, target: LoadTarget, req: BenchRequest) -> RequestResult:
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    result = RequestResult(ok=False)
    start = last = time.perf_counter()
    chunks, text = 0, []
    try:
        async with client.stream("POST", target.url, json=target.body(req), headers=headers) as resp:
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
                piece = _text(payload)
                if not piece:
                    continue
                now = time.perf_counter()
                if chunks == 0:
                    result.ttft_s = now - start
                else:
                    result.itl_s.append(now - last)
                last, chunks = now, chunks + 1
                text.append(piece)
    except Exception as exc:           # noqa: BLE001 - a failed request is a result, not a crash
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.e2e_s = time.perf_counter() - start
    result.output_tokens = result.output_tokens or chunks
    result.text = "".join(text)
    result.ok = True
    return result


def _text(payload: dict) -> str:
    """The text a streamed chunk carries (completions `text` or chat `delta.content`)."""
    return "".join(choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                   for choice in payload.get("choices") or [])


async def run_load(target: LoadTarget, requests: list[BenchRequest], rate: float, concurrency: int | None,
                   seed: int, on_done=None) -> tuple[list[RequestResult], float]:
    import httpx

    limit = asyncio.Semaphore(concurrency or len(requests) or 1)
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=concurrency or len(requests) or 1, max_keepalive_connections=64)

    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=30.0), limits=limits) as client:
        async def one(req: BenchRequest) -> RequestResult:
            async with limit:
                result = await send(client, target, req)
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


def print_report(summary: dict, title: str = "Serving benchmark") -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_header=True)
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


def endpoint_path(endpoint: str, backend: str | None) -> str:
    """`completions`/`chat` or vLLM's `--endpoint /v1/...` (with `--backend openai-chat` for chat)."""
    if endpoint not in ENDPOINTS:
        raise ValueError("--endpoint is completions, chat, /v1/completions or /v1/chat/completions")
    if backend == "openai-chat" and endpoint == "/v1/completions":
        return "/v1/chat/completions"
    return ENDPOINTS[endpoint]
