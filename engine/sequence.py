"""Sequence: one request's tokens, KV progress and block table, as the scheduler sees it."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from specfleet.engine.detokenizer import DetokenizerState
from specfleet.engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Sequence:
    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    params: SamplingParams
    arrival_time: float = 0.0
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0        # tokens whose KV is in the cache
    num_cached_tokens: int = 0          # of those, served by prefix-cache hits at admission
    block_table: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    output_logprobs: list[dict[int, float]] = field(default_factory=list)
    first_token_time: float | None = None
    first_scheduled_time: float | None = None    # monotonic, when first admitted to a step (kept on preemption)
    num_preemptions: int = 0
    late: bool = False                  # can no longer meet its TTFT deadline (deadline order only)
    spec_token_ids: list[int] = field(default_factory=list)   # draft tokens being verified this step
    spec_draft_probs: object | None = None                    # [k, V] draft distribution (None: n-gram)
    generator: object | None = None                           # torch.Generator for seeded sampling
    prompt: str | None = None
    lora_id: int = 0                    # the LoRA adapter's int id; 0: the base model
    output_text: str = ""
    detok: DetokenizerState = field(default_factory=DetokenizerState)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def reset_for_recompute(self) -> None:
        """Preemption by recompute: drop all KV; prompt and generated tokens are prefilled again."""
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        self.block_table = []
        self.spec_token_ids = []
        self.spec_draft_probs = None
        self.status = SequenceStatus.WAITING
        self.num_preemptions += 1
