"""RequestOutput: what the engine reports for a request after a step (incremental and final)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int]                      # all output tokens so far
    text: str                                 # detokenized output so far (stop string cut off)
    finished: bool = False
    finish_reason: str | None = None          # "stop" | "length" | "abort" | None while running
    stop_reason: int | str | None = None      # the stop token id or stop string that ended it
    logprobs: list[dict[int, float]] | None = None
    num_cached_tokens: int = 0                # prompt tokens served from the prefix cache
    new_token_ids: list[int] = field(default_factory=list)   # tokens added by this step
    first_scheduled_time: float | None = None  # time.monotonic() when it first joined a step (vLLM's metrics)
