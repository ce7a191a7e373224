"""The OpenAI endpoints' logic: request -> engine sub-requests -> JSON body or SSE stream.

One HTTP request fans out into `len(prompts) * n` engine requests (choice index = prompt * n + j),
all added in one command so a full queue refuses all of them. Streams hold back a possible partial
UTF-8 character and, with stop strings, the longest stop string's length minus one, so the chunks
always concatenate to the non-streamed text. A request whose `model` names a LoRA adapter runs every
sub-request with it and holds the adapter (`lora.LoRARegistry`) until it ends.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from specfleet.engine.engine import EngineOverloaded
from specfleet.engine.lora.manager import LoRAUnavailable
from specfleet.engine.outputs import RequestOutput
from specfleet.engine.sampling_params import SamplingParams
from specfleet.engine.server import openai_protocol as proto
from specfleet.engine.server.async_engine import EngineDead, RequestStream, SubRequest
from specfleet.engine.server.auth import Access
from specfleet.engine.server.limits import ServerLimits
from specfleet.engine.server.lora import LoRARegistry, ServedLoRA
from specfleet.engine.server.openai_protocol import ChatCompletionRequest, CompletionRequest, OpenAIError

DISCONNECT_POLL_S = 0.5


@dataclass
class ServerState:
    """What the endpoints share: the engine bridge, metrics, and the drain switch."""
    engine: "AsyncEngine"                      # noqa: F821 - specfleet.engine.server.async_engine
    metrics: "ServerMetrics"                   # noqa: F821 - specfleet.engine.server.metrics
    model_name: str
    access: Access = field(default_factory=Access)
    limits: ServerLimits = field(default_factory=ServerLimits)
    loras: LoRARegistry | None = None          # None: LoRARegistry(model_name), LoRA off
    created: int = field(default_factory=proto.now)
    draining: bool = False
    in_flight: int = 0

    def __post_init__(self) -> None:
        self.loras = self.loras or LoRARegistry(self.model_name)

    @property
    def tokenizer(self):
        return self.engine.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.engine.max_model_len

    async def drain(self, timeout_s: float) -> None:
        """Refuse new work, let in-flight requests finish within `timeout_s`, then abort the rest."""
        self.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (self.in_flight or self.engine.busy) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if self.in_flight or self.engine.busy:
            self.engine.abort_all()
            deadline = loop.time() + 2.0
            while self.in_flight and loop.time() < deadline:
                await asyncio.sleep(0.05)


@dataclass
class _Job:
    """One HTTP generation request after validation."""
    request_id: str
    prompts: list[list[int]]
    params: list[SamplingParams]             # one per engine sub-request
    stream: bool
    include_usage: bool
    holdback: int                            # characters a stream keeps back for stop strings
    logprobs: int | None
    param: str                               # where the prompt came from: "prompt" or "messages"
    lora: ServedLoRA | None = None           # the adapter the request's `model` names; None: the base model

    @property
    def model(self) -> str | None:
        return self.lora.request.lora_name if self.lora else None


@dataclass
class _Choice:
    sent: str = ""
    tokens_sent: int = 0

    def delta(self, out: RequestOutput, holdback: int) -> str:
        text = out.text
        end = len(text) if out.finished else len(text.rstrip("\ufffd")) - holdback
        chunk = text[len(self.sent):end] if end > len(self.sent) else ""
        self.sent += chunk
        return chunk


class OpenAIServing:
    def __init__(self, state: ServerState) -> None:
        self.state = state

    # ---- requests -> jobs -----------------------------------------------------------------
    def _check(self, req) -> ServedLoRA | None:
        """Refuses what cannot be served; returns the LoRA adapter the request names (None: the base model)."""
        state = self.state
        if state.draining:
            state.metrics.reject("draining")
            raise OpenAIError(503, "the server is shutting down; retry on another replica",
                              "service_unavailable_error", code="draining", headers={"Retry-After": "1"})
        lora = state.loras.resolve(req.model)
        field_name = req.unsupported()
        if field_name:
            raise proto.bad_request(f"`{field_name}` is not supported by this server", field_name, "unsupported")
        self._check_limits(req)
        return lora

    def _check_limits(self, req) -> None:
        limits = self.state.limits
        stops = [req.stop] if isinstance(req.stop, str) else req.stop or []
        if len(stops) > limits.max_stop_strings:
            raise proto.bad_request(f"at most {limits.max_stop_strings} stop strings per request", "stop",
                                    "too_many_stop_strings")
        if any(len(s) > limits.max_stop_chars for s in stops):
            raise proto.bad_request(f"stop strings are limited to {limits.max_stop_chars} characters", "stop",
                                    "stop_string_too_long")
        if len(req.stop_token_ids or ()) > limits.max_stop_token_ids:
            raise proto.bad_request(f"at most {limits.max_stop_token_ids} stop_token_ids per request",
                                    "stop_token_ids", "too_many_stop_token_ids")
        if req.n > limits.max_n:
            raise proto.bad_request(f"n must be at most {limits.max_n}", "n")

    def _params(self, req, prompt_len: int, max_tokens: int | None, logprobs: int | None, seed_offset: int,
                param: str) -> SamplingParams:
        limit = self.state.max_model_len
        if prompt_len >= limit:
            raise proto.bad_request(f"This model's maximum context length is {limit} tokens. However, your "
                                    f"prompt has {prompt_len} tokens.", param, "context_length_exceeded")
        if max_tokens is not None and prompt_len + max_tokens > limit:
            raise proto.bad_request(f"This model's maximum context length is {limit} tokens. However, you "
                                    f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the {param}, "
                                    f"{max_tokens} in the completion).", "max_tokens", "context_length_exceeded")
        temperature = 1.0 if req.temperature is None else req.temperature
        try:
            return SamplingParams(
                temperature=temperature, top_p=1.0 if req.top_p is None else req.top_p,
                top_k=-1 if req.top_k in (None, 0) else req.top_k,
                max_tokens=max_tokens if max_tokens is not None else limit - prompt_len,
                seed=None if req.seed is None else req.seed + seed_offset,
                stop=[s for s in ([req.stop] if isinstance(req.stop, str) else req.stop or []) if s],
                stop_token_ids=list(req.stop_token_ids or []), ignore_eos=req.ignore_eos, logprobs=logprobs)
        except ValueError as exc:
            raise proto.bad_request(str(exc)) from exc

    def _job(self, req, prompts: list[list[int]], max_tokens: int | None, logprobs: int | None,
             prefix: str, param: str, lora: ServedLoRA | None) -> _Job:
        if len(prompts) * req.n > self.state.limits.max_choices:
            raise proto.bad_request(f"at most {self.state.limits.max_choices} choices (prompts x n) per request", "n")
        params = [self._params(req, len(p), max_tokens, logprobs, j, param) for p in prompts for j in range(req.n)]
        stops = params[0].stop if params else []
        include_usage = bool(req.stream and req.stream_options and req.stream_options.include_usage)
        return _Job(proto.new_id(prefix), prompts, params, req.stream, include_usage,
                    max((len(s) for s in stops), default=1) - 1, logprobs, param, lora)

    def completion_prompts(self, req: CompletionRequest) -> list[list[int]]:
        prompt = req.prompt
        if isinstance(prompt, str):
            prompt = [prompt]
        elif prompt and isinstance(prompt[0], int):
            prompt = [prompt]
        if not prompt:
            raise proto.bad_request("prompt must not be empty", "prompt")
        if self.state.tokenizer is None and any(isinstance(p, str) for p in prompt):
            raise proto.bad_request("this server runs without a tokenizer: send prompts as token ids", "prompt")
        return [self.state.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompt]

    def chat_prompt(self, req: ChatCompletionRequest) -> list[int]:
        tokenizer = self.state.tokenizer
        if not getattr(tokenizer, "chat_template", None):
            raise proto.bad_request("this model has no chat template; use /v1/completions", "messages")
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                    for m in req.messages]
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False,
                                                 add_generation_prompt=req.add_generation_prompt)
        except Exception as exc:            # noqa: BLE001 - template errors are the caller's input
            raise proto.bad_request(f"chat template failed: {exc}", "messages") from exc
        return tokenizer.encode(text, add_special_tokens=False)

    # ---- endpoints ------------------------------------------------------------------------
    async def completions(self, req: CompletionRequest, http: Request):
        arrival = time.monotonic()
        lora = self._check(req)
        job = self._job(req, self.completion_prompts(req), req.max_tokens, req.logprobs, "cmpl", "prompt", lora)
        return await self._run(job, http, arrival, _CompletionFormat(self.state, job))

    async def chat(self, req: ChatCompletionRequest, http: Request):
        arrival = time.monotonic()
        lora = self._check(req)
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        max_tokens = req.max_completion_tokens or req.max_tokens
        job = self._job(req, [self.chat_prompt(req)], max_tokens, logprobs, "chatcmpl", "messages", lora)
        return await self._run(job, http, arrival, _ChatFormat(self.state, job))

    async def _run(self, job: _Job, http: Request, arrival: float, fmt: "_Format"):
        n = len(job.params) // len(job.prompts)
        lora_request = job.lora.request if job.lora else None
        items = [SubRequest(f"{job.request_id}-{i}", job.prompts[i // n], p, lora_request)
                 for i, p in enumerate(job.params)]
        self.state.loras.acquire(job.lora)          # before the first await: an unload now sees it in flight
        try:
            stream = await self._add(items, arrival, job.param)
        except BaseException:
            self.state.loras.release(job.lora)
            raise
        self.state.in_flight += 1
        if job.lora:
            self.state.metrics.lora_request(job.model)
        if job.stream:
            return _EngineStreamingResponse(self._events(stream, job, fmt), lambda: self._close(stream, job),
                                            media_type="text/event-stream",
                                            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            finals = await self._collect(stream, http)
        finally:
            self._close(stream, job)
        return JSONResponse(fmt.full(finals))

    async def _add(self, items: list[SubRequest], arrival: float, param: str) -> RequestStream:
        try:
            return await self.state.engine.add(items, arrival)
        except EngineOverloaded as exc:
            self.state.metrics.reject("overloaded")
            raise OpenAIError(429, f"the server is overloaded ({exc}); retry later", "rate_limit_error",
                              code="rate_limit_exceeded", headers={"Retry-After": "1"}) from exc
        except EngineDead as exc:
            raise OpenAIError(503, str(exc), "service_unavailable_error", code="engine_dead") from exc
        except LoRAUnavailable as exc:                 # the server's fault, not the request's
            raise OpenAIError(500, str(exc), "server_error", "model", "lora_adapter_unavailable") from exc
        except ValueError as exc:
            raise proto.bad_request(str(exc), param) from exc

    def _close(self, stream: RequestStream, job: _Job) -> None:
        if not stream.finished:
            self.state.engine.abort(stream.request_ids)     # queued ahead of any later unload of its adapter
        self.state.in_flight -= 1
        self.state.loras.release(job.lora)

    async def _collect(self, stream: RequestStream, http: Request) -> list[RequestOutput]:
        finals: dict[str, RequestOutput] = {}
        next_check = time.monotonic() + DISCONNECT_POLL_S
        while not stream.finished:
            try:
                out = await asyncio.wait_for(stream.next(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                out = None
            except EngineDead as exc:
                raise OpenAIError(500, str(exc), "server_error", code="engine_dead") from exc
            if out is not None and out.finished:
                finals[out.request_id] = out
            if time.monotonic() >= next_check:
                if await http.is_disconnected():
                    raise OpenAIError(499, "client closed the request", code="client_closed_request")
                next_check = time.monotonic() + DISCONNECT_POLL_S
        return [finals[request_id] for request_id in stream.request_ids]

    async def _events(self, stream: RequestStream, job: _Job, fmt: "_Format") -> AsyncIterator[str]:
        choices = [_Choice() for _ in stream.request_ids]
        opening = fmt.opening(len(choices))
        try:
            while not stream.finished:
                out = await stream.next()
                # The role chunk goes out with the first output, as vLLM's does: a client that times the
                # first chunk (vLLM's benchmark) then measures the first token, not the request's admission.
                for chunk in opening:
                    yield _sse(chunk)
                opening = []
                index = stream.index(out.request_id)
                chunk = fmt.chunk(index, out, choices[index])
                if chunk is not None:
                    yield _sse(chunk)
        except EngineDead as exc:
            yield _sse(proto.error_body(str(exc), "server_error", code="engine_dead"))
        if job.include_usage:
            yield _sse(fmt.usage_chunk())
        yield "data: [DONE]\n\n"


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'), ensure_ascii=False)}\n\n"


class _EngineStreamingResponse(StreamingResponse):
    """A StreamingResponse that always runs `on_close` (abort + bookkeeping), however the stream ends."""

    def __init__(self, content, on_close, **kwargs) -> None:
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


# ---- response formats -----------------------------------------------------------------------
class _Format:
    object_full = object_chunk = ""

    def __init__(self, state: ServerState, job: _Job) -> None:
        self.state, self.job = state, job
        self.created = proto.now()
        self.prompt_tokens = sum(len(p) for p in job.prompts)
        self.done: dict[int, RequestOutput] = {}

    def _envelope(self, obj: str, choices: list[dict]) -> dict:
        model = self.job.model or self.state.model_name
        return {"id": self.job.request_id, "object": obj, "created": self.created, "model": model,
                "choices": choices, "system_fingerprint": None}

    def _count(self, outputs: list[RequestOutput]) -> dict:
        completion_tokens = sum(len(o.token_ids) for o in outputs)
        cached_tokens = sum(o.num_cached_tokens for o in outputs[::self.n])
        return proto.usage(self.prompt_tokens, completion_tokens, cached_tokens)

    def usage_chunk(self) -> dict:
        body = self._envelope(self.object_chunk, [])
        body["usage"] = self._count([self.done[i] for i in sorted(self.done)])
        return body

    def _increment(self, index: int, out: RequestOutput, choice: _Choice):
        """(text, new token ids, their logprobs) to stream for this output, or None if nothing to send."""
        start = choice.tokens_sent
        new = self._streamed(index, out, choice)
        text = choice.delta(out, self.job.holdback)
        if not text and not out.finished and not (new and self.job.logprobs is not None):
            return None
        return text, new, (out.logprobs[start:start + len(new)] if out.logprobs is not None else None)

    def _with_usage(self, body: dict) -> dict:
        """Streamed chunks carry `usage: null` when the client asked for usage (OpenAI's convention)."""
        if self.job.include_usage:
            body["usage"] = None
        return body

    def _streamed(self, index: int, out: RequestOutput, choice: _Choice) -> list[int]:
        new = out.token_ids[choice.tokens_sent:]
        choice.tokens_sent = len(out.token_ids)
        if out.finished:
            self.done[index] = out
        return new

    @property
    def n(self) -> int:
        return len(self.job.params) // len(self.job.prompts)

    def _token(self, token_id: int) -> str:
        return self.state.tokenizer.decode([token_id]) if self.state.tokenizer is not None else ""

    def opening(self, num_choices: int) -> list[dict]:
        return []

    def full(self, outputs: list[RequestOutput]) -> dict:
        raise NotImplementedError

    def chunk(self, index: int, out: RequestOutput, choice: _Choice) -> dict | None:
        raise NotImplementedError


class _CompletionFormat(_Format):
    object_full = object_chunk = "text_completion"

    def full(self, outputs: list[RequestOutput]) -> dict:
        choices = [{"index": i, "text": o.text, "logprobs": self._logprobs(o.token_ids, o.logprobs),
                    "finish_reason": o.finish_reason, "stop_reason": o.stop_reason}
                   for i, o in enumerate(outputs)]
        body = self._envelope(self.object_full, choices)
        body["usage"] = self._count(outputs)
        return body

    def chunk(self, index: int, out: RequestOutput, choice: _Choice) -> dict | None:
        increment = self._increment(index, out, choice)
        if increment is None:
            return None
        text, new, lps = increment
        choices = [{"index": index, "text": text, "logprobs": self._logprobs(new, lps),
                    "finish_reason": out.finish_reason, "stop_reason": out.stop_reason}]
        return self._with_usage(self._envelope(self.object_chunk, choices))

    def _logprobs(self, token_ids: list[int], logprobs: list[dict] | None) -> dict | None:
        if self.job.logprobs is None or logprobs is None:
            return None
        tokens = [self._token(t) for t in token_ids]
        offsets, at = [], 0
        for tok in tokens:
            offsets.append(at)
            at += len(tok)
        tops = [{self._token(t): lp for t, lp in _top(entry, self.job.logprobs)} if self.job.logprobs else None
                for entry in logprobs]
        return {"tokens": tokens, "token_logprobs": [entry.get(t) for t, entry in zip(token_ids, logprobs)],
                "top_logprobs": tops, "text_offset": offsets}


class _ChatFormat(_Format):
    object_full, object_chunk = "chat.completion", "chat.completion.chunk"

    def full(self, outputs: list[RequestOutput]) -> dict:
        choices = [{"index": i, "message": {"role": "assistant", "content": o.text},
                    "logprobs": self._logprobs(o.token_ids, o.logprobs), "finish_reason": o.finish_reason,
                    "stop_reason": o.stop_reason} for i, o in enumerate(outputs)]
        body = self._envelope(self.object_full, choices)
        body["usage"] = self._count(outputs)
        return body

    def opening(self, num_choices: int) -> list[dict]:
        choices = [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                    "finish_reason": None} for i in range(num_choices)]
        return [self._with_usage(self._envelope(self.object_chunk, choices))]

    def chunk(self, index: int, out: RequestOutput, choice: _Choice) -> dict | None:
        increment = self._increment(index, out, choice)
        if increment is None:
            return None
        text, new, lps = increment
        delta = {"content": text} if text else {}
        choices = [{"index": index, "delta": delta, "logprobs": self._logprobs(new, lps),
                    "finish_reason": out.finish_reason, "stop_reason": out.stop_reason}]
        return self._with_usage(self._envelope(self.object_chunk, choices))

    def _logprobs(self, token_ids: list[int], logprobs: list[dict] | None) -> dict | None:
        if self.job.logprobs is None or logprobs is None:
            return None
        content = []
        for token_id, entry in zip(token_ids, logprobs):
            item = self._entry(token_id, entry.get(token_id, float("-inf")))
            item["top_logprobs"] = [self._entry(t, lp) for t, lp in _top(entry, self.job.logprobs)]
            content.append(item)
        return {"content": content}

    def _entry(self, token_id: int, logprob: float) -> dict:
        token = self._token(token_id)
        return {"token": token, "logprob": max(logprob, -9999.0), "bytes": list(token.encode("utf-8"))}


def _top(entry: dict[int, float], n: int) -> list[tuple[int, float]]:
    return sorted(entry.items(), key=lambda kv: kv[1], reverse=True)[:n]
