"""LLM: the offline API, `LLM(model=...).generate(prompts, sampling_params)`, as in vLLM."""
from __future__ import annotations

from typing import Sequence as Seq

from specfleet.engine.config import EngineConfig
from specfleet.engine.engine import LLMEngine
from specfleet.engine.lora.request import LoRARequest
from specfleet.engine.outputs import RequestOutput
from specfleet.engine.sampling_params import SamplingParams

Prompt = str | list[int]


def _as_prompt_list(prompts: Prompt | Seq[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
        return [prompts]
    return list(prompts)


class LLM:
    """`LLM(model, **engine_args)`: engine_args are `EngineConfig` fields, e.g. `skip_tokenizer_init=True`
    for a model folder without a tokenizer (then prompts are token ids and outputs carry ids, empty text)."""

    def __init__(self, model: str, **engine_args) -> None:
        self.engine = LLMEngine(EngineConfig(model=model, **engine_args))
        self._counter = 0

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: Prompt | Seq[Prompt],
                 sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
                 use_tqdm: bool = False,
                 lora_request: LoRARequest | Seq[LoRARequest | None] | None = None) -> list[RequestOutput]:
        """`lora_request`: one adapter for all prompts, or one (or None: the base model) per prompt."""
        prompt_list = _as_prompt_list(prompts)
        params = self._per_prompt(prompt_list, sampling_params, SamplingParams, SamplingParams(), "sampling params")
        loras = self._per_prompt(prompt_list, lora_request, LoRARequest, None, "LoRA requests")
        encoded = [self.engine.encode(p) for p in prompt_list]
        ids = [self._next_id() for _ in prompt_list]
        for request_id, prompt_ids, p, lora in zip(ids, encoded, params, loras):
            self.engine.validate(prompt_ids, request_id, p)    # all-or-nothing before any is queued
            self.engine.load_lora(lora)
        for request_id, prompt, p, lora in zip(ids, prompt_list, params, loras):
            self.engine.add_request(request_id, prompt, p, lora_request=lora)
        return self._run(ids, use_tqdm)

    @staticmethod
    def _per_prompt(prompts: list[Prompt], given, kind: type, default, what: str) -> list:
        """One value per prompt from a single value (or None: `default`) or a list of them."""
        if given is None or isinstance(given, kind):
            return [given or default] * len(prompts)
        if len(given) != len(prompts):
            raise ValueError(f"{len(given)} {what} for {len(prompts)} prompts")
        return list(given)

    def _next_id(self) -> str:
        self._counter += 1
        return f"offline-{self._counter}"

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        progress = _progress(len(ids)) if use_tqdm else None
        while len(finished) < len(ids):
            for out in self.engine.step():
                if out.finished:
                    finished[out.request_id] = out
                    if progress:
                        progress.advance(progress.task_ids[0])
        if progress:
            progress.stop()
        return [finished[i] for i in ids]

    def set_speculation(self, enabled: bool | None = None, num_speculative_tokens: int | None = None) -> dict:
        return self.engine.set_speculation(enabled, num_speculative_tokens)


def _progress(total: int):
    from rich.progress import Progress

    progress = Progress(transient=True)
    progress.add_task("generating", total=total)
    progress.start()
    return progress
