"""What the balancer learns from the engines themselves: each ready pod's `/metrics`, read every
`QUEUE_POLL_S`, gives its prefill queue (`vllm:num_requests_waiting`) and the LoRA adapters it serves
(`adapters.served_adapters`)."""
from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp

from specfleet.cluster.gateway.adapters import served_adapters
from specfleet.cluster.gateway.routing import Balancer

QUEUE_POLL_S = 0.25
WAITING_METRIC = "vllm:num_requests_waiting"


async def scrape(session: aiohttp.ClientSession, balancer: Balancer, url: str) -> tuple[float | None, frozenset[str]]:
    """(the engine's waiting gauge, the adapters it serves). The gauge is None when it cannot be read: the pick
    then counts only what this gateway sent; the requests sent since count from this poll on."""
    sent = balancer.sent.pop(url, 0)
    try:
        async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=QUEUE_POLL_S * 4)) as r:
            text = await r.text() if r.status == 200 else ""
    except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError):
        text = ""
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(WAITING_METRIC)]
    if not values:
        balancer.sent[url] = balancer.sent.get(url, 0) + sent
        return None, served_adapters(text)
    return sum(values), served_adapters(text)


async def poll_forever(session: aiohttp.ClientSession, balancer: Balancer,
                       on_round: Callable[[bool], None] = lambda changed: None) -> None:
    """Poll every ready pod, forever; `on_round(adapters_changed)` after each round."""
    while True:
        urls = sorted(balancer.urls())
        results = await asyncio.gather(*(scrape(session, balancer, url) for url in urls))
        balancer.waiting = {url: waiting for url, (waiting, _) in zip(urls, results) if waiting is not None}
        served = {url: adapters for url, (_, adapters) in zip(urls, results) if adapters}
        changed = served != balancer.served
        if changed:
            balancer.served = served
        on_round(changed)
        await asyncio.sleep(QUEUE_POLL_S)
