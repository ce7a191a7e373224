"""LLM: the offline API, `LLM(model=...).generate(prompts, sampling_params)`, as in vLLM."""
from __future__ import annotations

from typing import Sequence as Seq

from specfleet.engine.config import EngineConfig
from specfleet.engine.engine import LLMEngine
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
                 use_tqdm: bool = False) -> list[RequestOutput]:
        prompt_list = _as_prompt_list(prompts)
        params = self._params_for(prompt_list, sampling_params)
        encoded = [self.engine.encode(p) for p in prompt_list]
        ids = [self._next_id() for _ in prompt_list]
        for request_id, prompt_ids, p in zip(ids, encoded, params):
            self.engine.validate(prompt_ids, request_id, p)    # all-or-nothing before any is queued
        for request_id, prompt, p in zip(ids, prompt_list, params):
            self.engine.add_request(request_id, prompt, p)
        return self._run(ids, use_tqdm)

    def _params_for(self, prompts: list[Prompt], sampling_params) -> list[SamplingParams]:
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            return [sampling_params or SamplingParams()] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"{len(sampling_params)} sampling params for {len(prompts)} prompts")
        return list(sampling_params)

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
