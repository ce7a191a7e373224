"""Token-budget scheduler: continuous batching with chunked prefill and preemption by recompute.

Each step shares `max_num_batched_tokens` between running sequences (decodes, verifications and
unfinished prefill chunks, oldest first) and then waiting sequences, at most `max_num_seqs` running.
When the pool runs dry the newest running sequence is preempted: its blocks are freed and it goes back
to the head of the waiting queue, to be prefilled again (its prefix is often still cached).
"""
from __future__ import annotations

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

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self._schedule_running(out, self.max_num_batched_tokens)
        self._schedule_waiting(out, budget)
        return out

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
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            chunk = self.block_manager.try_admit(seq, budget)
            if chunk == 0:
                break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.add(seq, chunk)
            budget -= chunk

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
