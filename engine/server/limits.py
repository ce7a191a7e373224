"""Request limits: what one HTTP request may ask of the server, so hostile input costs a 4xx, not memory.

`ServerLimits` holds the bounds (all configurable, sane defaults); `BodyLimit` is the ASGI middleware that
answers 413 in the OpenAI error shape before a too-large body is buffered: at once when Content-Length
says so, or as soon as a chunked body passes the limit.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from specfleet.engine.server.openai_protocol import MAX_CHOICES, MAX_N, error_body

MiB = 1024 * 1024
DRAIN_BYTES = 64 * MiB       # a larger refused body is not read to its end; the connection is closed


@dataclass(frozen=True)
class ServerLimits:
    max_request_bytes: int = 4 * MiB     # a 128k-token prompt as JSON token ids fits
    max_stop_strings: int = 16           # OpenAI allows 4; vLLM does not bound it
    max_stop_chars: int = 1024           # streams hold back the longest stop string
    max_stop_token_ids: int = 256
    max_n: int = MAX_N                   # also enforced by the request schema
    max_choices: int = MAX_CHOICES       # prompts x n in one request
    max_in_flight: int | None = None     # generation requests held at once; None: the engine's
                                         # max_num_seqs + max_waiting_requests (past it: 429 before parsing)

    def __post_init__(self) -> None:
        for name in ("max_request_bytes", "max_stop_strings", "max_stop_chars", "max_stop_token_ids"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


class AdmissionGate:
    """ASGI middleware: past `limit` generation requests in flight, 429 with Retry-After before the body is
    read, parsed or tokenized, so an overload costs the server almost nothing per refused request."""

    def __init__(self, app, limit: int, paths: tuple[str, ...] = ("/v1/completions", "/v1/chat/completions")):
        self.app, self.limit, self.paths = app, limit, paths
        self.in_flight = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in self.paths:
            return await self.app(scope, receive, send)
        if self.in_flight >= self.limit:
            return await _send_error(send, 429, f"the server is overloaded ({self.in_flight} requests in flight); "
                                     "retry later", "rate_limit_error", "rate_limit_exceeded",
                                     [(b"retry-after", b"1")])
        self.in_flight += 1
        done = False

        async def send_and_release(message) -> None:
            # A request stops counting when its last byte is handed over, not when the app returns: a
            # client that sends its next request at once must not find its previous one still counted.
            nonlocal done
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body") and not done:
                done = True
                self.in_flight -= 1

        try:
            await self.app(scope, receive, send_and_release)
        finally:
            if not done:
                self.in_flight -= 1


class BodyLimit:
    """ASGI middleware: 413 for request bodies over `max_bytes`, whatever their transfer encoding."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            if not length.isdigit() or int(length) > self.max_bytes:
                return await self._too_large(receive, send)
            return await self.app(scope, receive, send)     # the HTTP layer enforces the declared length
        messages, size = [], 0
        while True:                                         # chunked: buffer up to the limit, then replay
            message = await receive()
            messages.append(message)
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                return await self._too_large(receive, send, message)
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        return await self.app(scope, _replay(messages, receive), send)

    async def _too_large(self, receive, send, last: dict | None = None) -> None:
        # Read and drop the rest of the body (bounded) before answering: a server that closes a socket
        # with unread input resets it, and the client may never see the 413.
        dropped = 0
        while (last is None or last.get("more_body")) and dropped < DRAIN_BYTES:
            last = await receive()
            if last["type"] != "http.request":
                return
            dropped += len(last.get("body", b""))
        await _send_error(send, 413, f"the request body is larger than {self.max_bytes} bytes",
                          "invalid_request_error", "request_too_large", [(b"connection", b"close")])


async def _send_error(send, status: int, message: str, type: str, code: str, headers: list) -> None:
    body = json.dumps(error_body(message, type, None, code)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


def _replay(messages: list[dict], receive):
    queue = list(messages)

    async def replayed() -> dict:
        return queue.pop(0) if queue else await receive()
    return replayed
