"""Engine counters and per-step records: the raw material of the server's Prometheus metrics, and a file
sink for the records (`StepLog`)."""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field


@dataclass
class StepRecord:
    duration_s: float
    num_seqs: int                 # sequences computed in the step (the batch size)
    num_tokens: int               # tokens computed in the step (prefill chunks + decodes + drafts)
    num_decode_seqs: int          # sequences that produced a token from a decode or verification
    num_prefill_tokens: int
    speculating: bool


class StepLog:
    """A step listener that appends one JSON line per engine step to a file: the monotonic time the step
    ended and its `StepRecord`. What vLLM's `--enable-logging-iteration-details` logs, in a form a script
    reads (how the scheduler packed prompts and decodes under real arrivals, and what each step cost).
    Listeners run on the thread that steps the engine, so there is one writer; lines are flushed as written
    and the file closes with the process."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1, encoding="utf-8")

    def __call__(self, record: StepRecord) -> None:
        line = json.dumps({"t": round(time.monotonic(), 6), **asdict(record)}, separators=(",", ":"))
        self._file.write(line + "\n")


@dataclass
class EngineStats:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    prefix_queried_tokens: int = 0
    prefix_hit_tokens: int = 0
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_accepted_by_position: list[int] = field(default_factory=list)
    counterfactual_draft_tokens: int = 0      # n-gram proposals scored while speculation is off
    counterfactual_accepted_tokens: int = 0
    spec_decode_seq_steps: int = 0            # decoding sequence-steps while speculating (drafted or not)
    counterfactual_seq_steps: int = 0         # decoding sequence-steps scored while speculation is off
    ngram_proposal_seq_steps: int = 0         # decoding sequence-steps given a fresh n-gram proposal, on or off
    ngram_proposed_by_depth: list[int] = field(default_factory=list)   # [j - 1]: sum of min(proposal length, j)
    steps: int = 0
