"""The operator's thread pools for blocking work, one per kind of work, so no kind queues behind another.

A handler's reconcile runs in asyncio's default executor (`asyncio.to_thread`): it is what a user waits on
after `kubectl apply`. The control loop's Kubernetes calls (its status writes above all) and the parse of a
Prometheus answer are background work that comes in waves: a fleet's loops, started together, write their
first status together. In one shared pool, a wave that the API server is slow to answer holds every
thread, and an edit's reconcile waits for all of it (tests/operator/test_threads.py). Here the control
loop has `CONTROL_THREADS` of its own and the parse one, so a wave queues only behind itself while
reconciles keep the default executor.
"""
from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

T = TypeVar("T")
# Two: a wave of status writes still goes out at the API server's pace, and leaves the reconciles the CPU.
CONTROL_THREADS = 2
_control = ThreadPoolExecutor(CONTROL_THREADS, thread_name_prefix="specfleet-control")
_parse = ThreadPoolExecutor(1, thread_name_prefix="specfleet-parse")


async def in_control_thread(call: Callable[..., T], /, *args) -> T:
    """`call(*args)` in one of the control loop's threads (its Kubernetes calls)."""
    return await asyncio.get_running_loop().run_in_executor(_control, functools.partial(call, *args))


async def in_parse_thread(call: Callable[..., T], /, *args) -> T:
    """`call(*args)` in the thread that parses Prometheus answers."""
    return await asyncio.get_running_loop().run_in_executor(_parse, functools.partial(call, *args))
