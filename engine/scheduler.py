"""Token-budget scheduler: continuous batching with chunked prefill and preemption by recompute.

Each step shares `max_num_batched_tokens` between running sequences (decodes, verifications and
unfinished prefill chunks, oldest first) and then waiting sequences, at most `max_num_seqs` running.
When the pool runs dry the newest running sequence is preempted: its blocks are freed and it goes back
to the head of the waiting queue, to be prefilled again (its prefix is often still cached).

With `ttft_deadline_ms` set, waiting prompts are admitted in deadline order: those that can still get
their first token by arrival + target, if prefilled at the step's spare budget behind the on-time
prompts ahead of them, go first (arrival order), late ones after them (arrival order). In an overload
FIFO makes every queued request late; this keeps about capacity/arrivals of them in time. Nothing is
dropped, late prompts get whatever budget the on-time ones leave, and a late prompt stays late.

With LoRA, running sequences use at most `max_loras` distinct adapters (one slot each): a waiting
sequence whose adapter would be one too many waits, and those behind it may pass it.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from specfleet.engine.config import EngineConfig
from specfleet.engine.kv.block_manager import BlockManager
from specfleet.engine.sequence import Sequence, SequenceStatus


@dataclass
class SchedulerOutput:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)   # tokens each sequence computes now
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def add(self, seq: Sequence, num_new_tokens: int) -> None:
        self.seqs.append(seq)
        self.num_new_tokens.append(num_new_tokens)


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.ttft_deadline_s = config.ttft_deadline_ms / 1000 if config.ttft_deadline_ms else None
        self.step_time_s = 0.0          # recent step time (EWMA), reported by the engine
        self.max_loras = config.max_loras if config.enable_lora else None

    def observe_step(self, seconds: float) -> None:
        self.step_time_s = seconds if not self.step_time_s else 0.8 * self.step_time_s + 0.2 * seconds

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self._schedule_running(out, self.max_num_batched_tokens)
        if self.ttft_deadline_s is not None:
            self._order_by_deadline(budget, time.monotonic())
        self._schedule_waiting(out, budget)
        return out

    def _order_by_deadline(self, budget: int, now: float) -> None:
        if not self.waiting or budget <= 0 or self.step_time_s <= 0:
            return
        rate = budget / self.step_time_s           # prompt tokens/s next to the running sequences
        ahead = sum(s.num_uncomputed_tokens for s in self.running if s.num_uncomputed_tokens > 1)
        head, on_time, late = [], [], []
        for seq in self.waiting:
            if seq.num_preemptions:                 # preempted sequences keep the head of the queue
                head.append(seq)
                continue
            if not seq.late:
                seq.late = now + (ahead + seq.num_uncomputed_tokens) / rate > seq.arrival_time + self.ttft_deadline_s
                ahead += 0 if seq.late else seq.num_uncomputed_tokens
            (late if seq.late else on_time).append(seq)
        if late:
            self.waiting = deque(head + on_time + late)

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            wanted = min(seq.num_uncomputed_tokens + len(seq.spec_token_ids), budget)
            if wanted < seq.num_uncomputed_tokens + len(seq.spec_token_ids) and seq.spec_token_ids:
                seq.spec_token_ids = []                      # no room to verify: plain decode
                wanted = min(seq.num_uncomputed_tokens, budget)
            if not self._make_room(seq, wanted, out):
                continue                                      # seq itself was preempted
            self.block_manager.append(seq, wanted)
            out.add(seq, wanted)
            budget -= wanted
            i += 1
        return budget

    def _make_room(self, seq: Sequence, num_tokens: int, out: SchedulerOutput) -> bool:
        while not self.block_manager.can_append(seq, num_tokens):
            victim = self.running[-1]
            self.preempt(victim, out)
            if victim is seq:
                return False
        return True

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        passed: list[Sequence] = []                 # waiting for a LoRA slot; keep their place in the queue
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not self._lora_fits(seq):
                passed.append(self.waiting.popleft())
                continue
            chunk = self.block_manager.try_admit(seq, budget)
            if chunk == 0:
                break
            self.waiting.popleft()
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = time.monotonic()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.add(seq, chunk)
            budget -= chunk
        self.waiting.extendleft(reversed(passed))

    def _lora_fits(self, seq: Sequence) -> bool:
        if not seq.lora_id or self.max_loras is None:
            return True
        in_use = self.running_loras()
        return seq.lora_id in in_use or len(in_use) < self.max_loras

    def running_loras(self) -> set[int]:
        return {s.lora_id for s in self.running if s.lora_id}

    def preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)
        out.preempted.append(seq)

    def finish(self, seq: Sequence) -> None:
        """Release a sequence at once, whether it ended normally or was aborted."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
