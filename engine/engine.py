"""LLMEngine: the step-level engine that the offline API and the HTTP server drive.

`add_request` validates and queues; `step` schedules one token-budget step, runs the model, samples,
applies stop rules, frees finished sequences at once, and reports what changed; `abort` frees a
request's blocks at the next opportunity. Not thread-safe: one owner thread calls it.
"""
from __future__ import annotations

import time
from typing import Callable

import torch

from specfleet.engine.backends import prepare_backend
from specfleet.engine.config import EngineConfig
from specfleet.engine.cpu.tuning import keep_large_allocations_on_heap
from specfleet.engine.detokenizer import IncrementalDetokenizer
from specfleet.engine.kv.block_manager import BlockManager
from specfleet.engine.lora.layers import LoRASlots
from specfleet.engine.lora.manager import LoRAManager
from specfleet.engine.lora.request import LoRARequest
from specfleet.engine.model.loader import load_model
from specfleet.engine.model_runner import ModelRunner, SampleRows, kv_bytes_per_block
from specfleet.engine.outputs import RequestOutput
from specfleet.engine.sampler import SamplingTensors, sample_tokens, token_logprobs
from specfleet.engine.sampling_params import SamplingParams
from specfleet.engine.scheduler import Scheduler, SchedulerOutput
from specfleet.engine.sequence import Sequence
from specfleet.engine.speculative.control import SpeculationControl
from specfleet.engine.speculative.draft import DraftProposer
from specfleet.engine.speculative.ngram import NgramProposer
from specfleet.engine.speculative.speculator import Speculator
from specfleet.engine.stats import EngineStats, StepRecord

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class EngineOverloaded(RuntimeError):
    """The waiting queue is full; the caller should retry later (HTTP 429)."""


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ValueError(f"dtype must be auto or one of {', '.join(DTYPES)}, got {name!r}")
    return DTYPES[name]


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        from transformers import AutoTokenizer

        self.config = config
        self.device = pick_device(config.device)
        if self.device.type == "cpu":
            keep_large_allocations_on_heap()
        self.dtype = pick_dtype(config.dtype, self.device)
        loaded = load_model(config.model, self.dtype, self.device, config.max_model_len)
        self.model_path = loaded.path
        self.model_name = config.served_model_name or config.model
        self.tokenizer = None if config.skip_tokenizer_init else AutoTokenizer.from_pretrained(loaded.path)
        self.detokenizer = IncrementalDetokenizer(self.tokenizer) if self.tokenizer is not None else None
        self.eos_token_ids = loaded.eos_token_ids
        self.vocab_size = loaded.model.shape.vocab_size
        prepare_backend(loaded.model, config.attention_backend, self.device)
        self.lora = self._build_lora(loaded) if config.enable_lora else None    # before the pool takes memory
        num_blocks = self._pool_blocks(loaded.model)
        self.max_model_len = min(config.max_model_len or loaded.max_position_embeddings,
                                 loaded.max_position_embeddings, num_blocks * config.block_size)
        self.runner = ModelRunner(loaded.model, num_blocks, config.block_size, self.dtype, self.device,
                                  self.lora.slots.batch if self.lora else None)
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching,
                                          config.free_block_watermark)
        self.scheduler = Scheduler(config, self.block_manager)
        self.requests: dict[str, Sequence] = {}
        self.stats = EngineStats()
        self.step_listeners: list[Callable[[StepRecord], None]] = []
        self.detokenize_every_step = False       # the server streams text; offline needs it at the end
        self.speculation = SpeculationControl(config.speculative_method,
                                              max(config.max_speculative_tokens, config.num_speculative_tokens),
                                              config.speculation_enabled, config.num_speculative_tokens)
        self.speculator = self._build_speculator(num_blocks) if config.speculative_method else None
        self._speculating = False

    # ---- sizing ---------------------------------------------------------------------------
    def _pool_blocks(self, model) -> int:
        if self.config.num_kv_blocks:
            return self.config.num_kv_blocks
        per_block = kv_bytes_per_block(model, self.config.block_size, self.dtype)
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            budget = total * self.config.gpu_memory_utilization - (total - free) - 512 * 2**20
        else:
            budget = self.config.cpu_kv_cache_gib * 2**30
        if budget < per_block:
            raise ValueError("no memory left for the KV cache; lower the model size or raise the memory share")
        return int(budget // per_block)

    def _build_lora(self, loaded) -> LoRAManager:
        c = self.config
        slots = LoRASlots(loaded.model, c.max_loras, c.max_lora_rank, self.dtype, self.device)
        names = tuple(n for n in (c.model, str(loaded.path), c.served_model_name) if n)
        return LoRAManager(slots, loaded.model.shape, c.max_lora_rank, c.max_cpu_loras, names,
                           lambda: {seq.lora_id for seq in self.requests.values() if seq.lora_id})

    def _build_speculator(self, num_blocks: int) -> Speculator:
        draft = None
        if self.config.speculative_method == "draft":
            draft = DraftProposer(self.config.draft_model, num_blocks + self.config.max_num_seqs,
                                  self.config.block_size, self.dtype, self.device, self.vocab_size, self.max_model_len,
                                  self.config.attention_backend)
        ngram = NgramProposer(self.config.ngram_min, self.config.ngram_max)
        depths = max(self.config.max_speculative_tokens, self.config.num_speculative_tokens)
        return Speculator(self.config.speculative_method, ngram, draft, self.vocab_size, self.max_model_len, self.stats,
                          depths)

    # ---- requests -------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def kv_cache_usage(self) -> float:
        return self.block_manager.usage

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("the engine runs without a tokenizer (skip_tokenizer_init=True): "
                                 "pass prompts as token ids")
            return self.tokenizer.encode(prompt) if prompt else []
        if any(not isinstance(t, int) or not 0 <= t < self.vocab_size for t in prompt):
            raise ValueError(f"prompt token ids must be integers in [0, {self.vocab_size})")
        return list(prompt)

    def validate(self, prompt_ids: list[int], request_id: str, params: SamplingParams | None = None) -> None:
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if params is not None and params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer; the engine runs with skip_tokenizer_init=True "
                             "(use stop_token_ids)")
        if not prompt_ids:
            raise ValueError("prompt is empty")
        if len(prompt_ids) >= self.max_model_len:
            raise ValueError(f"prompt has {len(prompt_ids)} tokens but the model's context is "
                             f"{self.max_model_len} tokens (including at least one output token)")

    def load_lora(self, request: LoRARequest | None) -> int:
        """The adapter's int id (0: none), its folder validated and cached. Raises LoRAError or ValueError."""
        if request is None:
            return 0
        if self.lora is None:
            raise ValueError(f"request names LoRA adapter {request.lora_name!r} but the engine runs without "
                             "LoRA (enable_lora=True)")
        return self.lora.register(request)

    def remove_lora(self, lora_int_id: int) -> bool:
        """Unload an adapter (vLLM's name); False if it is not loaded. Raises ValueError while a request uses it."""
        if self.lora is None:
            return False
        users = [s.request_id for s in self.requests.values() if s.lora_id == lora_int_id]
        if users:
            raise ValueError(f"LoRA adapter {lora_int_id} is in use by {len(users)} request(s)")
        return self.lora.unregister(lora_int_id)

    def lora_names(self) -> dict[int, str]:
        """Int id -> name of every loaded adapter."""
        return {i: r.lora_name for i, r in self.lora.requests.items()} if self.lora else {}

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams | None = None,
                    arrival_time: float | None = None, lora_request: LoRARequest | None = None) -> None:
        params = params or SamplingParams()
        prompt_ids = self.encode(prompt)
        self.validate(prompt_ids, request_id, params)
        lora_id = self.load_lora(lora_request)
        free_slots = max(0, self.config.max_num_seqs - self.num_running)
        if self.num_waiting >= self.config.max_waiting_requests + free_slots:
            raise EngineOverloaded(f"{self.num_waiting} requests are already waiting")
        seq = Sequence(request_id, prompt_ids, len(prompt_ids), params, arrival_time or time.monotonic(),
                       prompt=prompt if isinstance(prompt, str) else None, lora_id=lora_id)
        if params.seed is not None:
            seq.generator = torch.Generator(device=self.device).manual_seed(params.seed)
        self.requests[request_id] = seq
        self.scheduler.add(seq)

    def abort(self, request_id: str) -> RequestOutput | None:
        seq = self.requests.pop(request_id, None)
        if seq is None:
            return None
        self._finish(seq)
        seq.finish_reason = "abort"
        return self._output(seq, [])

    def get_speculation(self) -> dict:
        return self.speculation.state()

    def set_speculation(self, enabled: bool | None = None, num_speculative_tokens: int | None = None) -> dict:
        """Thread-safe; takes effect at the next step. Raises SpeculationNotConfigured or ValueError."""
        return self.speculation.update(enabled, num_speculative_tokens)

    # ---- the step -------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        start = time.perf_counter()
        k = self.speculation.active_k if self.speculator else 0
        self._speculating = k > 0
        drafted = self.speculator.propose(self.scheduler.running, k) if k else []
        scheduled = self.scheduler.schedule()
        self.stats.preemptions += len(scheduled.preempted)
        self._drop_unscheduled_drafts(drafted, scheduled)
        if not scheduled.seqs:
            return []
        decodes = self._decoding(scheduled)           # before verification clears the drafts
        if self._speculating:
            self.stats.spec_decode_seq_steps += decodes[0]
        logits, rows = self.runner.execute(scheduled, self._lora_slots(scheduled))
        for seq, n in zip(scheduled.seqs, scheduled.num_new_tokens):
            if not seq.spec_token_ids:
                seq.num_computed_tokens += n
        plain = [r for r in rows if r.num_rows == 1]
        verifying = [r for r in rows if r.num_rows > 1]
        sampled = self._sample(logits, plain) + self._verify(logits, verifying)
        outputs = [self._advance(row, tokens, lp) for row, tokens, lp in sampled]
        for seq in scheduled.seqs:
            if not seq.is_finished:
                self.block_manager.publish(seq)
        duration = time.perf_counter() - start
        self.scheduler.observe_step(duration)
        self._record(scheduled, decodes, bool(verifying), duration)
        return outputs

    def _lora_slots(self, scheduled: SchedulerOutput) -> dict[int, int] | None:
        if self.lora is None:
            return None
        needed = {seq.lora_id for seq in scheduled.seqs if seq.lora_id}
        if not needed:
            return None
        return self.lora.activate(needed, self.scheduler.running_loras())

    def _drop_unscheduled_drafts(self, drafted: list[Sequence], scheduled: SchedulerOutput) -> None:
        in_step = {id(s) for s in scheduled.seqs}
        for seq in drafted:
            if id(seq) not in in_step or not seq.spec_token_ids:
                self.speculator.drop(seq)

    def _verify(self, logits: torch.Tensor, rows: list[SampleRows]):
        if not rows:
            return []
        picked = torch.cat([logits[r.first_row:r.first_row + r.num_rows] for r in rows])
        verdict = self.speculator.verify([r.seq for r in rows], picked)
        out = []
        for row, accepted, tokens in zip(rows, verdict.num_accepted, verdict.tokens):
            row.seq.num_computed_tokens += 1 + accepted
            self.block_manager.trim(row.seq)
            out.append((row, tokens, []))
        return out

    def _sample(self, logits: torch.Tensor, rows: list[SampleRows]):
        if not rows:
            return []
        params = [r.seq.params for r in rows]
        idx = torch.tensor([r.first_row for r in rows], device=logits.device)
        tensors = SamplingTensors.build(params, self.vocab_size, logits.device)
        tokens = sample_tokens(logits[idx], tensors, [r.seq.generator for r in rows])
        want_lp = [p.logprobs for p in params]
        logprobs = token_logprobs(logits[idx], tokens, want_lp) if any(n is not None for n in want_lp) else [None] * len(rows)
        return [(row, [tok], [lp] if lp is not None else []) for row, tok, lp in zip(rows, tokens.tolist(), logprobs)]

    def _advance(self, row: SampleRows, tokens: list[int], logprobs: list[dict]) -> RequestOutput:
        seq = row.seq
        now = time.monotonic()
        if seq.first_token_time is None:
            seq.first_token_time = now
            self.stats.prompt_tokens += seq.num_prompt_tokens
        new: list[int] = []
        for token in tokens:
            seq.token_ids.append(token)
            new.append(token)
            if self._check_stop(seq, token):
                break
        seq.output_logprobs += logprobs[:len(new)]
        self.stats.generation_tokens += len(new)
        if self.speculator and not self._speculating:
            self.speculator.observe(seq, new, self.speculation.k)
        if seq.finish_reason is not None:
            self.requests.pop(seq.request_id, None)
            self._finish(seq)
        elif self.detokenize_every_step:
            seq.output_text = self._decode(seq)
        return self._output(seq, new)

    def _finish(self, seq: Sequence) -> None:
        self.scheduler.finish(seq)
        if self.speculator:
            self.speculator.release(seq.request_id)

    def _check_stop(self, seq: Sequence, token: int) -> bool:
        p = seq.params
        if token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids):
            seq.finish_reason, seq.stop_reason = "stop", token if token in p.stop_token_ids else None
        elif seq.num_output_tokens >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            seq.finish_reason = "length"
        if p.stop or seq.finish_reason:
            seq.output_text = self._decode(seq)
        if p.stop and seq.finish_reason != "stop":
            self._check_stop_strings(seq)
        return seq.finish_reason is not None

    def _check_stop_strings(self, seq: Sequence) -> None:
        window = max(len(s) for s in seq.params.stop) + 8 * max(1, len(seq.params.stop))
        tail_start = max(0, len(seq.output_text) - window)
        for stop in seq.params.stop:
            at = seq.output_text.find(stop, tail_start)
            if at >= 0:
                end = at + len(stop) if seq.params.include_stop_str_in_output else at
                seq.output_text = seq.output_text[:end]
                seq.finish_reason, seq.stop_reason = "stop", stop
                return

    def _decode(self, seq: Sequence) -> str:
        if self.detokenizer is None:
            return ""
        return self.detokenizer.update(seq.detok, seq.token_ids, seq.num_prompt_tokens,
                                       final=seq.finish_reason is not None)

    def _output(self, seq: Sequence, new: list[int]) -> RequestOutput:
        return RequestOutput(seq.request_id, seq.prompt, seq.token_ids[:seq.num_prompt_tokens],
                             seq.output_token_ids, seq.output_text, seq.finish_reason is not None,
                             seq.finish_reason, seq.stop_reason,
                             seq.output_logprobs if seq.params.logprobs is not None else None,
                             seq.num_cached_tokens, new, seq.first_scheduled_time)

    @staticmethod
    def _decoding(scheduled: SchedulerOutput) -> tuple[int, int]:
        """(sequences decoding or verifying drafts, the tokens they compute); the rest are prompt tokens."""
        seqs = tokens = 0
        for seq, n in zip(scheduled.seqs, scheduled.num_new_tokens):
            if seq.num_output_tokens > 0 and n <= 1 + len(seq.spec_token_ids):
                seqs, tokens = seqs + 1, tokens + n
        return seqs, tokens

    def _record(self, scheduled: SchedulerOutput, decodes: tuple[int, int], speculating: bool,
                duration: float) -> None:
        seqs, tokens = decodes
        record = StepRecord(duration, len(scheduled.seqs), scheduled.num_batched_tokens, seqs,
                            scheduled.num_batched_tokens - tokens, speculating)
        self.stats.steps += 1
        self.stats.prefix_queried_tokens = self.block_manager.prefix_stats.queried_tokens
        self.stats.prefix_hit_tokens = self.block_manager.prefix_stats.hit_tokens
        for listener in self.step_listeners:
            listener(record)
