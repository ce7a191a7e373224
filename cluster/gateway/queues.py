"""The engines' prefill queues, as the balancer sees them: each ready pod's `vllm:num_requests_waiting`
read from its `/metrics` every `QUEUE_POLL_S`."""
from __future__ import annotations

import asyncio

import aiohttp

from specfleet.cluster.gateway.routing import Balancer

QUEUE_POLL_S = 0.25
WAITING_METRIC = "vllm:num_requests_waiting"


async def waiting_of(session: aiohttp.ClientSession, balancer: Balancer, url: str) -> float | None:
    """The engine's waiting gauge (None when it cannot be read: the pick then counts only what this
    gateway sent); the requests sent since count from this poll on."""
    sent = balancer.sent.pop(url, 0)
    try:
        async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=QUEUE_POLL_S * 4)) as r:
            text = await r.text() if r.status == 200 else ""
    except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError):
        text = ""
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(WAITING_METRIC)]
    if not values:
        balancer.sent[url] = balancer.sent.get(url, 0) + sent
        return None
    return sum(values)


async def poll_forever(session: aiohttp.ClientSession, balancer: Balancer) -> None:
    while True:
        urls = sorted(balancer.urls())
        results = await asyncio.gather(*(waiting_of(session, balancer, url) for url in urls))
        balancer.waiting = {url: value for url, value in zip(urls, results) if value is not None}
        await asyncio.sleep(QUEUE_POLL_S)
