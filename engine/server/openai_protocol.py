"""OpenAI wire format: request models (validated with pydantic), response bodies and the error shape.

Requests ignore unknown fields (as vLLM does), reject what the engine cannot honour with a clear 400,
and carry vLLM's extensions (`top_k`, `ignore_eos`, `stop_token_ids`). vLLM's own benchmark client
(`vllm bench serve`) always sends `repetition_penalty: 1.0` and may send `min_p` and `min_tokens`: their
neutral values are accepted, anything else is refused by name.
"""
from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_N = 16
MAX_CHOICES = 64          # prompts x n in one request


class OpenAIError(Exception):
    """An error that the app turns into `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: str | int | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, "invalid_request_error", param, code)


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Request):
    include_usage: bool = False


class _SamplingRequest(_Request):
    model: str | None = None                    # None: the served model
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    seed: Annotated[int, Field(ge=-2**63, lt=2**63)] | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    min_tokens: Annotated[int, Field(ge=0)] | None = None

    def unsupported(self) -> str | None:
        """The name of a field set to something the engine does not implement, if any."""
        if self.presence_penalty or self.frequency_penalty:
            return "presence_penalty" if self.presence_penalty else "frequency_penalty"
        if self.repetition_penalty not in (None, 1.0):
            return "repetition_penalty"
        if self.min_p or self.min_tokens:
            return "min_p" if self.min_p else "min_tokens"
        return "logit_bias" if self.logit_bias else None


class CompletionRequest(_SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: Annotated[int, Field(ge=1)] | None = 16
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def unsupported(self) -> str | None:
        if self.echo:
            return "echo"
        if self.suffix:
            return "suffix"
        if self.best_of is not None and self.best_of != self.n:
            return "best_of"
        return super().unsupported()


class TextPart(_Request):
    type: Literal["text"]
    text: str


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_SamplingRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    add_generation_prompt: bool = True
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None

    def unsupported(self) -> str | None:
        if self.tools:
            return "tools"
        if self.response_format and self.response_format.get("type", "text") != "text":
            return "response_format"
        return super().unsupported()


class SpeculationUpdate(_Request):
    model_config = ConfigDict(extra="forbid")
    enabled: bool | None = None
    num_speculative_tokens: Annotated[int, Field(ge=0)] | None = None


class LoadLoRAAdapterRequest(_Request):
    """vLLM's `POST /v1/load_lora_adapter` body."""
    lora_name: Annotated[str, Field(min_length=1)]
    lora_path: Annotated[str, Field(min_length=1)]


class UnloadLoRAAdapterRequest(_Request):
    lora_name: Annotated[str, Field(min_length=1)]


# ---- responses (plain dicts: they are built on every streamed token) --------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def model_card(name: str, created: int, max_model_len: int, root: str | None = None,
               parent: str | None = None) -> dict:
    """A /v1/models entry; a LoRA adapter has its folder as `root` and the base model as `parent`, as in vLLM."""
    return {"id": name, "object": "model", "created": created, "owned_by": "specfleet", "root": root or name,
            "parent": parent, "max_model_len": max_model_len}
