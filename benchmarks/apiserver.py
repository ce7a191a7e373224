"""Benchmark the Kubernetes API emulator: 10,000 objects and 100 concurrent watches.

Runs `specfleet cluster apiserver` in a subprocess (so its RSS is its own), opens the watches, creates the
objects over HTTP, then measures reads while the watches stay open. Prints a table and writes JSON to
benchmarks/results/apiserver.json.

    .venv/bin/python benchmarks/apiserver.py [--objects 10000] [--watches 100] [--concurrency 32]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from rich.console import Console
from rich.table import Table

NS_PATH = "/api/v1/namespaces/default/configmaps"
from provenance import stamp                     # benchmarks/provenance.py: command, commit, machine, date

RESULTS = Path(__file__).parent / "results" / "apiserver.json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] * 1000


async def wait_ready(session: aiohttp.ClientSession, url: str) -> None:
    for _ in range(200):
        try:
            async with session.get(url + "/version") as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.05)
    raise RuntimeError("emulator did not start")


async def watcher(session: aiohttp.ClientSession, url: str, shard: int, rv: str, counts: list[int]) -> None:
    params = {"watch": "true", "labelSelector": f"shard=s{shard}", "resourceVersion": rv}
    async with session.get(url + NS_PATH, params=params, timeout=aiohttp.ClientTimeout(total=None)) as r:
        async for line in r.content:
            if line.strip():
                counts[shard] += 1


async def timed(session: aiohttp.ClientSession, method: str, url: str, latencies: list[float], **kw) -> None:
    start = time.perf_counter()
    async with session.request(method, url, **kw) as r:
        await r.read()
        if r.status >= 300:
            raise RuntimeError(f"{method} {url}: {r.status}")
    latencies.append(time.perf_counter() - start)


async def run_phase(n: int, concurrency: int, make) -> float:
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with sem:
            await make(i)
    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return time.perf_counter() - start


async def bench(url: str, pid: int, objects: int, watches: int, concurrency: int) -> dict:
    connector = aiohttp.TCPConnector(limit=concurrency + watches + 8)
    async with aiohttp.ClientSession(connector=connector) as session:
        await wait_ready(session, url)
        rss_start = rss_mib(pid)
        async with session.get(url + NS_PATH) as r:
            rv = (await r.json())["metadata"]["resourceVersion"]
        counts = [0] * watches
        tasks = [asyncio.create_task(watcher(session, url, i, rv, counts)) for i in range(watches)]
        await asyncio.sleep(0.5)
        create: list[float] = []

        def body(i: int) -> str:
            return json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
                "name": f"cm-{i:05d}", "labels": {"shard": f"s{i % watches}", "app": "bench"}},
                "data": {"key": "x" * 64}})
        create_s = await run_phase(objects, concurrency, lambda i: timed(
            session, "POST", url + NS_PATH, create, data=body(i), headers={"Content-Type": "application/json"}))
        expected = objects // watches
        deadline = time.monotonic() + 60
        while min(counts) < expected and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        get: list[float] = []
        get_s = await run_phase(2000, concurrency, lambda i: timed(
            session, "GET", f"{url}{NS_PATH}/cm-{(i * 7919) % objects:05d}", get))
        patch: list[float] = []
        patch_s = await run_phase(2000, concurrency, lambda i: timed(
            session, "PATCH", f"{url}{NS_PATH}/cm-{i % objects:05d}", patch, data=json.dumps({"data": {"n": str(i)}}),
            headers={"Content-Type": "application/merge-patch+json"}))
        lists: list[float] = []
        list_s = await run_phase(50, 4, lambda i: timed(
            session, "GET", url + NS_PATH, lists, params={"labelSelector": f"shard=s{i % watches}"}))
        rss_end = rss_mib(pid)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    phase = lambda name, lat, secs: {"op": name, "count": len(lat), "seconds": round(secs, 2),
                                     "per_second": round(len(lat) / secs, 1),
                                     "p50_ms": round(percentile(lat, 0.5), 2), "p99_ms": round(percentile(lat, 0.99), 2)}
    all_lat = create + get + patch + lists
    return {"objects": objects, "watches": watches, "concurrency": concurrency,
            "watch_events_delivered": sum(counts), "watch_events_expected_min": expected * watches,
            "rss_mib_start": round(rss_start, 1), "rss_mib_end": round(rss_end, 1),
            "p99_request_ms": round(percentile(all_lat, 0.99), 2),
            "phases": [phase("create", create, create_s), phase("get", get, get_s),
                       phase("merge-patch", patch, patch_s), phase("list (label selector)", lists, list_s)]}


def show(result: dict) -> None:
    table = Table(title=f"API emulator: {result['objects']} objects, {result['watches']} watches")
    for column in ("op", "count", "seconds", "per_second", "p50_ms", "p99_ms"):
        table.add_column(column, justify="right")
    for p in result["phases"]:
        table.add_row(*(str(p[c]) for c in ("op", "count", "seconds", "per_second", "p50_ms", "p99_ms")))
    console = Console()
    console.print(table)
    console.print(f"RSS {result['rss_mib_start']} MiB -> {result['rss_mib_end']} MiB; p99 over all requests "
                  f"{result['p99_request_ms']} ms; watch events delivered {result['watch_events_delivered']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--watches", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    port = free_port()
    kubeconfig = Path(tempfile.mkdtemp()) / "kubeconfig"
    server = subprocess.Popen([sys.executable, "-m", "specfleet.cli.main", "cluster", "apiserver", "--port",
                               str(port), "--kubeconfig", str(kubeconfig)], stdout=subprocess.DEVNULL)
    try:
        result = stamp("benchmarks/apiserver.py", sys.argv[1:])
        result |= asyncio.run(bench(f"http://127.0.0.1:{port}", server.pid, args.objects, args.watches,
                                   args.concurrency))
    finally:
        server.terminate()
        server.wait(timeout=10)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    show(result)


if __name__ == "__main__":
    main()
