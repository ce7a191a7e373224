"""Deadline-ordered admission (`ttft_deadline_ms`): prompts that can still meet arrival + target go first,
late ones after them, preempted sequences keep the head, nothing is dropped; without it, arrival order.
Each sequence keeps the time it first joined a step (the queue time the server reports)."""
from __future__ import annotations

import time

from specfleet.engine import LLM, SamplingParams
from specfleet.engine.config import EngineConfig
from specfleet.engine.kv.block_manager import BlockManager
from specfleet.engine.sampling_params import SamplingParams as Params
from specfleet.engine.scheduler import Scheduler, SchedulerOutput
from specfleet.engine.sequence import Sequence


def scheduler(deadline_ms: float | None, max_num_seqs: int = 2, budget: int = 64) -> Scheduler:
    config = EngineConfig(model="unused", max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                          ttft_deadline_ms=deadline_ms)
    sched = Scheduler(config, BlockManager(64, 16, enable_prefix_caching=False, watermark=0.0))
    sched.observe_step(0.01)                    # 64 tokens per 10 ms: 6,400 prompt tokens/s
    return sched


def waiting(sched: Scheduler, ages_s: list[float], prompt_len: int = 16) -> list[Sequence]:
    now = time.monotonic()
    seqs = [Sequence(f"r{i}", list(range(1, prompt_len + 1)), prompt_len, Params(), now - age)
            for i, age in enumerate(ages_s)]
    for seq in seqs:
        sched.add(seq)
    return seqs


def admitted(sched: Scheduler) -> list[str]:
    return [s.request_id for s in sched.schedule().seqs]


def test_without_a_deadline_prompts_are_admitted_in_arrival_order():
    sched = scheduler(None)
    waiting(sched, [5.0, 4.0, 0.0, 0.0])
    assert admitted(sched) == ["r0", "r1"]


def test_on_time_prompts_go_before_late_ones_and_late_ones_still_run():
    sched = scheduler(1000)
    seqs = waiting(sched, [5.0, 4.0, 0.0, 0.0])           # r0, r1 are past their 1 s deadline
    assert admitted(sched) == ["r2", "r3"]
    assert [s.late for s in seqs] == [True, True, False, False]
    for seq in list(sched.running):                       # the on-time ones finish; the late ones follow
        sched.finish(seq)
    assert admitted(sched) == ["r0", "r1"]


def test_a_prompt_that_would_wait_past_its_deadline_behind_on_time_prompts_is_late():
    sched = scheduler(1000, max_num_seqs=1, budget=16)    # 1,600 prompt tokens/s
    seqs = waiting(sched, [0.4, 0.4, 0.4], prompt_len=400)
    admitted(sched)
    # 400 tokens take 0.25 s each and 0.6 s are left: the first two still make it, the third would not
    assert [s.late for s in seqs] == [False, False, True]


def test_preempted_sequences_keep_the_head_of_the_queue():
    sched = scheduler(1000)
    old = waiting(sched, [5.0])[0]
    old.num_preemptions = 1
    waiting(sched, [0.0, 0.0])
    assert admitted(sched)[0] == "r0"


def test_a_sequence_keeps_the_time_it_first_joined_a_step_through_preemption():
    sched = scheduler(None, max_num_seqs=1)
    first, second = waiting(sched, [0.0, 0.0])
    assert first.first_scheduled_time is None
    before = time.monotonic()
    assert admitted(sched) == ["r0"]
    joined = first.first_scheduled_time
    assert joined is not None and before <= joined <= time.monotonic() and second.first_scheduled_time is None
    sched.preempt(first, SchedulerOutput())
    assert admitted(sched) == ["r0"]                      # back at the head of the queue, joined again
    assert first.first_scheduled_time == joined


def test_engine_with_deadline_order_serves_every_request_identically(tiny_llama):
    prompts = [[5 + i, 6, 7, 8, 9] * (1 + i % 3) for i in range(12)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    plain = LLM(tiny_llama, num_kv_blocks=64, max_num_seqs=3).generate(prompts, params)
    ordered = LLM(tiny_llama, num_kv_blocks=64, max_num_seqs=3, ttft_deadline_ms=1).generate(prompts, params)
    assert [o.token_ids for o in ordered] == [o.token_ids for o in plain]
    assert all(o.finish_reason == "length" for o in ordered)
