"""Multi-LoRA: PEFT adapters served per row in one batch, token for token equal to transformers + peft."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from lora_kit import ADAPTERS, build_adapters, peft_greedy
from safetensors.torch import load_file, save_file

from specfleet.engine import LLM, EngineConfig, LoRARequest, SamplingParams
from specfleet.engine.lora.adapter import LoRAError
from specfleet.engine.lora.layers import LoRABatch, LoRALinear, TorchLoRAOps
from specfleet.engine.lora.manager import LoRAUnavailable

GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
ENGINE = dict(num_kv_blocks=128, block_size=8, enable_lora=True, max_lora_rank=16)


@pytest.fixture(scope="module")
def adapters(tiny_llama, tmp_path_factory) -> dict[str, LoRARequest]:
    folders = build_adapters(tiny_llama, tmp_path_factory.mktemp("adapters"))
    return {name: LoRARequest(name, i, path) for i, (name, path) in enumerate(folders.items(), start=1)}


def record_active_adapters(llm: LLM) -> list[set[int]]:
    """The adapters of each step that used any, as the engine asks the slot manager for them."""
    seen, activate = [], llm.engine.lora.activate
    llm.engine.lora.activate = lambda needed, keep: (seen.append(set(needed)), activate(needed, keep))[1]
    return seen


def test_batched_op_adds_each_rows_own_adapter_and_nothing_to_base_rows():
    """The contract a GPU kernel for `add_lora` must meet: row t gets B[slot_t] A[slot_t] x_t, slot -1 nothing."""
    gen = torch.Generator().manual_seed(0)
    slots, rank, fan_in, fan_out = 3, 4, 16, 24
    a, bt = torch.randn(slots, rank, fan_in, generator=gen), torch.randn(slots, rank, fan_out, generator=gen)
    x, y = torch.randn(6, fan_in, generator=gen), torch.randn(6, fan_out, generator=gen)
    token_slots = torch.tensor([2, -1, 0, 2, 1, -1])
    batch = LoRABatch(slots)
    batch.set(token_slots, torch.float32)
    out = TorchLoRAOps.add_lora(y.clone(), x, a, bt, batch.state)
    for t, s in enumerate(token_slots.tolist()):
        expected = y[t] if s < 0 else y[t] + (a[s] @ x[t]) @ bt[s]
        torch.testing.assert_close(out[t], expected)
    assert torch.equal(out[1], y[1]) and torch.equal(out[5], y[5])         # base rows bit-exact


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_each_adapter_matches_transformers_peft(tiny_llama, adapters, hf_greedy, mixed_prompts, name):
    prompts = mixed_prompts(3, seed=7)
    outs = LLM(tiny_llama, **ENGINE).generate(prompts, GREEDY, lora_request=adapters[name])
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == peft_greedy(tiny_llama, adapters[name].lora_path, prompt)
    assert any(o.token_ids != hf_greedy(tiny_llama, p, 16) for p, o in zip(prompts, outs))   # it does change them


@pytest.mark.parametrize("max_loras", [3, 1])
def test_mixed_batch_of_adapters_and_base_equals_each_request_alone(tiny_llama, adapters, mixed_prompts, max_loras):
    prompts = mixed_prompts(4, seed=8) * 2                   # each prompt with two different adapters
    a, b, c = adapters.values()
    loras = [None, a, b, c, a, b, c, None]
    llm = LLM(tiny_llama, **ENGINE, max_loras=max_loras, max_cpu_loras=max_loras)
    steps = record_active_adapters(llm)
    together = llm.generate(prompts, GREEDY, lora_request=loras)
    assert max(len(s) for s in steps) == max_loras          # several adapters share a step, never more than slots
    alone = LLM(tiny_llama, **ENGINE, enable_prefix_caching=False)
    for prompt, lora, out in zip(prompts, loras, together):
        assert out.token_ids == alone.generate([prompt], GREEDY, lora_request=lora)[0].token_ids
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


def test_prefix_cache_is_not_shared_across_adapters(tiny_llama, adapters, hf_greedy):
    prompt = list(range(10, 50))                              # 5 blocks of 8: 4 cacheable
    llm = LLM(tiny_llama, **ENGINE, max_loras=2)
    a, b = adapters["all"], adapters["qv-rslora"]
    runs = [(a, 0), (b, 0), (None, 0), (a, 32), (None, 32), (b, 32)]   # (adapter, cached tokens expected)
    for lora, cached in runs:
        out = llm.generate([prompt], GREEDY, lora_request=lora)[0]
        assert out.num_cached_tokens == cached, lora
        assert out.token_ids == (hf_greedy(tiny_llama, prompt, 16) if lora is None
                                 else peft_greedy(tiny_llama, lora.lora_path, prompt))


def test_ngram_speculation_with_adapters_matches_peft(tiny_llama, adapters):
    prompts = [[5, 6, 7, 8] * 6, [9, 10, 11] * 8]
    loras = [adapters["all"], adapters["mlp"]]
    llm = LLM(tiny_llama, **ENGINE, max_loras=2, speculative_method="ngram", num_speculative_tokens=3, ngram_min=1)
    outs = llm.generate(prompts, GREEDY, lora_request=loras)
    assert llm.engine.stats.spec_draft_tokens > 0
    for prompt, lora, out in zip(prompts, loras, outs):
        assert out.token_ids == peft_greedy(tiny_llama, lora.lora_path, prompt)


def test_draft_model_speculation_refuses_lora(tiny_llama):
    with pytest.raises(ValueError, match="enable_lora cannot be combined with speculative_method='draft'"):
        EngineConfig(model=tiny_llama, enable_lora=True, speculative_method="draft", draft_model=tiny_llama)


def test_without_enable_lora_the_model_has_no_lora_layers_and_refuses_adapters(tiny_llama, adapters):
    llm = LLM(tiny_llama, num_kv_blocks=32)
    assert not any(isinstance(m, LoRALinear) for m in llm.engine.runner.model.modules())
    with pytest.raises(ValueError, match="runs without LoRA"):
        llm.generate([[1, 2, 3]], GREEDY, lora_request=adapters["all"])


def test_slots_are_reused_least_recently_used_first_but_never_from_running(tiny_llama, adapters):
    manager = LLM(tiny_llama, **ENGINE, max_loras=2).engine.lora
    ids = [manager.register(r) for r in adapters.values()]
    assert manager.activate({ids[0]}, set()) == {ids[0]: 0}
    assert manager.activate({ids[1]}, set()) == {ids[1]: 1}
    assert manager.activate({ids[2]}, {ids[0]}) == {ids[2]: 1}     # ids[0] is older but running
    assert manager.activate({ids[1]}, set()) == {ids[1]: 0}         # now ids[0] is the oldest
    with pytest.raises(RuntimeError, match="held by running sequences"):
        manager.activate({ids[0]}, {ids[1], ids[2]})


def test_removed_adapter_frees_its_slot_and_its_id_never_names_another(tiny_llama, adapters):
    llm = LLM(tiny_llama, **ENGINE, max_loras=1)
    a, b = adapters["all"], adapters["mlp"]
    llm.generate([[1, 2, 3]], GREEDY, lora_request=a)
    llm.engine.add_request("busy", [1, 2, 3], GREEDY, lora_request=a)
    with pytest.raises(ValueError, match="in use by 1 request"):
        llm.engine.remove_lora(a.lora_int_id)
    llm.engine.abort("busy")
    assert llm.engine.remove_lora(a.lora_int_id) and not llm.engine.remove_lora(a.lora_int_id)
    assert llm.engine.lora.free_slots == [0] and a.lora_int_id not in llm.engine.lora.cpu
    with pytest.raises(LoRAError, match="belonged to an unloaded adapter"):
        llm.generate([[1, 2, 3]], GREEDY, lora_request=LoRARequest("b", a.lora_int_id, b.lora_path))


# ---- adapters the engine must refuse ------------------------------------------------------------------
def _edit_config(**changes):
    def edit(folder):
        config = json.loads((folder / "adapter_config.json").read_text())
        (folder / "adapter_config.json").write_text(json.dumps({**config, **changes}))
    return edit


def _edit_tensors(edit_one):
    def edit(folder):
        tensors = load_file(folder / "adapter_model.safetensors")
        save_file(dict(edit_one(name, t) for name, t in tensors.items()), folder / "adapter_model.safetensors")
    return edit


BAD = {
    "not a PEFT folder": (lambda f: (f / "adapter_config.json").unlink(),
                          r"not a PEFT adapter folder \(no adapter_config"),
    "no weights": (lambda f: (f / "adapter_model.safetensors").unlink(), r"no adapter_model.safetensors"),
    "rank above max": (_edit_config(r=12), r"adapter rank r=12 exceeds max_lora_rank=8"),
    "module the model lacks": (_edit_config(target_modules=["q_proj", "fc1"]),
                               r"modules the model has no LoRA slot for: \['fc1'\]"),
    "tensor of a module the model lacks": (_edit_tensors(lambda n, t: (n.replace("o_proj", "dense"), t)),
                                           r"tensor '.*self_attn\.dense\.lora_[AB]\.weight' is for a module"),
    "layer the model lacks": (_edit_tensors(lambda n, t: (n.replace("layers.1.", "layers.5."), t)),
                              r"is for layer 5; the model has 2 layers"),
    "wrong shapes": (_edit_tensors(lambda n, t: (n, t[:, :32].contiguous() if "q_proj.lora_A" in n else t)),
                     r"q_proj: lora_A is \(8, 32\) and lora_B \(64, 8\), expected \(8, 64\) and \(64, 8\)"),
    "other base model": (_edit_config(base_model_name_or_path="someone/other-model"),
                         r"trained on 'someone/other-model'"),
    "DoRA": (_edit_config(use_dora=True), r"uses DoRA"),
}


@pytest.fixture(scope="module")
def strict_llm(tiny_llama) -> LLM:
    return LLM(tiny_llama, **{**ENGINE, "max_lora_rank": 8})


@pytest.mark.parametrize("case", list(BAD))
def test_bad_adapter_is_refused_with_its_reason(strict_llm, adapters, tmp_path, case):
    edit, message = BAD[case]
    folder = tmp_path / "adapter"
    shutil.copytree(adapters["all"].lora_path, folder)
    edit(folder)
    with pytest.raises(LoRAError, match=message):
        strict_llm.generate([[1, 2, 3]], GREEDY, lora_request=LoRARequest("bad", 50, str(folder)))
    assert not strict_llm.engine.has_unfinished()


def test_one_int_id_for_two_adapters_is_refused(strict_llm, adapters):
    strict_llm.generate([[1, 2, 3]], GREEDY, lora_request=LoRARequest("first", 60, adapters["all"].lora_path))
    with pytest.raises(LoRAError, match="lora_int_id 60 already names adapter 'first'"):
        strict_llm.generate([[1, 2, 3]], GREEDY,
                            lora_request=LoRARequest("second", 60, adapters["qv-rslora"].lora_path))


# ---- adapters whose folder is gone ---------------------------------------------------------------------
def _run(engine) -> dict[str, list[int]]:
    """Step until idle; request id -> its tokens."""
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    return tokens


def test_in_flight_adapters_stay_on_cpu_so_a_deleted_folder_never_fails_a_step(tiny_llama, adapters, tmp_path):
    """One slot and one CPU copy for two adapters: each request's adapter stays on CPU until the request ends,
    so with both folders deleted the one that waits for the slot still runs (before: its folder was read again
    inside the step, which raised and killed the engine loop)."""
    prompt = list(range(10, 30))
    a, b = (LoRARequest(name, i, shutil.copytree(adapters[name].lora_path, tmp_path / name))
            for i, name in [(1, "all"), (2, "mlp")])
    llm = LLM(tiny_llama, **ENGINE, max_loras=1, max_cpu_loras=1)
    expected = {r.lora_name: llm.generate([prompt], GREEDY, lora_request=r)[0].token_ids for r in (a, b)}
    for r in (a, b):
        llm.engine.add_request(r.lora_name, prompt, GREEDY, lora_request=r)
    assert set(llm.engine.lora.cpu) == {1, 2}                 # over max_cpu_loras while both are in use
    for r in (a, b):
        shutil.rmtree(r.lora_path)
    assert _run(llm.engine) == expected


def test_a_request_for_an_adapter_dropped_from_cpu_whose_folder_is_gone_fails_alone(tiny_llama, adapters, tmp_path):
    prompt = list(range(10, 30))
    gone = LoRARequest("gone", 1, shutil.copytree(adapters["all"].lora_path, tmp_path / "gone"))
    other = adapters["mlp"]
    llm = LLM(tiny_llama, **ENGINE, max_loras=1, max_cpu_loras=1)
    llm.generate([prompt], GREEDY, lora_request=gone)
    expected = llm.generate([prompt], GREEDY, lora_request=other)[0].token_ids     # drops `gone` from CPU
    shutil.rmtree(gone.lora_path)
    with pytest.raises(LoRAUnavailable, match="'gone' was dropped from the CPU cache .* cannot be read again"):
        llm.engine.add_request("x", prompt, GREEDY, lora_request=gone)
    assert not llm.engine.has_unfinished()
    llm.engine.add_request("y", prompt, GREEDY, lora_request=other)
    assert _run(llm.engine) == {"y": expected}
