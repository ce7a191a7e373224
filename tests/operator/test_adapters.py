"""LoRA adapters in the InferenceService: validation, the memory plan, rendering, and the pure sync
(which folder each adapter loads from, the per-pod diff, the engine's answers, status and Events)."""
from __future__ import annotations

import pytest
import torch

from specfleet.operator import adapters, api, capacity, cost, planner, render, status
from specfleet.operator.adapters import Desired, PodResult
from tests.operator.conftest import BASE, deep_merge

LLAMA_8B_PVC = {"model": {"name": "m", "source": "pvc://models/llama", "architecture": {
    "numLayers": 32, "hiddenSize": 4096, "numAttentionHeads": 32, "numKvHeads": 8, "headDim": 128,
    "intermediateSize": 14336, "vocabSize": 128256, "parameters": 8030261248}}}
TWO = [{"name": "sql", "source": "adapters/sql"}, {"name": "chat", "source": "pvc://models/adapters/chat", "rank": 8}]


def spec(**over) -> api.InferenceServiceSpec:
    return api.parse_spec(deep_merge(deep_merge(BASE, LLAMA_8B_PVC), over))


def spec_errors(**over) -> list[str]:
    with pytest.raises(api.SpecError) as info:
        spec(**over)
    return info.value.errors


# -- validation --------------------------------------------------------------------------------------
def test_adapters_parse_with_the_lora_defaults_and_lora_is_off_without_either():
    s = spec(adapters=TWO)
    assert s.adapters == (api.Adapter("sql", "adapters/sql"), api.Adapter("chat", "pvc://models/adapters/chat", 8))
    assert s.lora is None and s.lora_limits == api.LoRA(4, 16, None)
    assert spec().lora_limits is None
    assert spec(lora={}).lora_limits == api.LoRA(4, 16, None)           # on with an empty list
    assert spec(lora={"maxLoras": 2, "maxLoraRank": 64, "maxCpuLoras": 8}).lora_limits == api.LoRA(2, 64, 8)


def test_schema_errors_of_adapters_are_reported_together():
    text = "; ".join(spec_errors(adapters=[*TWO, {"name": "Bad_Name", "source": "a/../../etc", "rank": 0}]))
    assert "spec.adapters[2].name: 'Bad_Name' does not match" in text
    assert "spec.adapters[2].source: 'a/../../etc' is not a folder on the model volume" in text
    assert "spec.adapters[2].rank: 0 is outside [1, 512]" in text


def test_every_broken_cross_field_rule_is_reported_together():
    errors = spec_errors(adapters=[*TWO, {"name": "sql", "source": "x", "rank": 32}, {"name": "m", "source": "y"}],
                         lora={"maxLoras": 4, "maxCpuLoras": 2})
    assert errors == ["spec.adapters: duplicate name(s) sql", "spec.adapters: 'm' is the base model's name",
                      "spec.adapters[sql].rank: 32 exceeds lora.maxLoraRank 16",
                      "spec.lora: maxCpuLoras must not be below maxLoras"]


def test_a_rank_within_a_raised_maximum_is_accepted_and_vllm_is_refused():
    assert spec(adapters=[{"name": "big", "source": "a", "rank": 64}], lora={"maxLoraRank": 64}).adapters[0].rank == 64
    assert api.ADAPTERS_VLLM_RULE in spec_errors(adapters=TWO, runtime={"engine": "vllm"})


# -- the memory plan ---------------------------------------------------------------------------------
def test_slot_bytes_equal_what_the_engine_allocates(tiny_llama):
    from specfleet.engine.lora.layers import LoRASlots
    from specfleet.engine.model.loader import load_model

    model = load_model(tiny_llama, torch.float32, torch.device("cpu")).model
    slots = LoRASlots(model, 3, 8, torch.float32, torch.device("cpu"))
    allocated = sum(m.lora_a.numel() * 4 + m.lora_bt.numel() * 4 for layer in slots.layers for m in layer.values())
    arch = api.Architecture(num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2, head_dim=16,
                            intermediate_size=128, vocab_size=512, parameters=139584)
    assert cost.lora_slot_bytes(arch.with_dtype("float32"), 3, 8) == allocated


def test_adapter_slots_shrink_the_kv_pool_by_their_bytes(gpus, models):
    # Llama 3.1 8B, bf16, 4 slots of rank 16, per slot and layer: qkv 3*16*(4096+6144) + o 16*8192
    # + gate_up 2*16*(4096+2*14336) + down 16*(14336+4096) = 1,966,080 elements, x 32 layers x 4 slots x 2 bytes
    # = 503,316,480 bytes; a 16-token block of KV is 16 * 131,072 = 2,097,152 bytes: exactly 240 blocks.
    without = planner.plan(spec(), gpus, models)
    with_lora = planner.plan(spec(adapters=TWO), gpus, models)
    assert with_lora.lora_slot_bytes == 503_316_480 and without.lora_slot_bytes == 0
    assert without.kv_cache_blocks - with_lora.kv_cache_blocks == 240
    assert status.plan_dict(with_lora)["loraSlotBytes"] == 503_316_480
    assert "loraSlotBytes" not in status.plan_dict(without)
    bigger = planner.plan(spec(adapters=TWO, lora={"maxLoras": 8, "maxLoraRank": 64}), gpus, models)
    assert without.kv_cache_blocks - bigger.kv_cache_blocks == 240 * 8


def test_slots_that_leave_no_room_for_the_context_are_insufficient_memory(gpus, models):
    result = planner.plan(spec(adapters=TWO, lora={"maxLoras": 64, "maxLoraRank": 512}), gpus, models)
    assert isinstance(result, planner.Infeasible) and result.reason == "InsufficientMemory"
    assert "GB of adapter slots leave room for" in result.message


def test_on_cpu_the_slots_come_out_of_the_same_memory_request(gpus, models):
    tiny = {"accelerator": {"type": "cpu", "count": 1}, "slo": {"ttftP99Ms": 60000, "itlP99Ms": 5000},
            "model": {"dtype": "float32", "architecture": {
                "numLayers": 2, "hiddenSize": 64, "numAttentionHeads": 4, "numKvHeads": 2, "headDim": 16,
                "intermediateSize": 128, "vocabSize": 512, "parameters": 139584}}}
    plain = planner.plan(spec(**tiny), gpus, models)
    lora = planner.plan(spec(**tiny, lora={"maxLoras": 64, "maxLoraRank": 512}), gpus, models)
    assert lora.lora_slot_bytes == 64 * 2 * 512 * (3 * (64 + 128) + 128 + 2 * (64 + 256) + 192) * 4   # 402,653,184
    block = plain.block_size * plain.kv_bytes_per_token
    kv = [p.kv_cache_blocks * block for p in (plain, lora)]
    assert kv[0] - block < kv[1] + lora.lora_slot_bytes <= kv[0]
    assert render.resources(lora) == render.resources(plain)


# -- rendering -----------------------------------------------------------------------------------------
def _engine(s: api.InferenceServiceSpec, gpus, models) -> dict:
    plan = planner.plan(s, gpus, models)
    return render.render("svc", "ns", s, plan)[0]["spec"]["template"]["spec"]["containers"][0]


def test_lora_flags_and_working_dir_are_rendered_but_never_the_adapter_list(gpus, models):
    container = _engine(spec(adapters=TWO, lora={"maxCpuLoras": 6}), gpus, models)
    args = container["args"]
    assert args[args.index("--enable-lora"):args.index("--admin-token-file")] == [
        "--enable-lora", "--max-loras", "4", "--max-lora-rank", "16", "--max-cpu-loras", "6"]
    assert container["workingDir"] == "/models/model"
    assert "sql" not in str(container) and "chat" not in str(container)
    edited = [{"name": "other", "source": "adapters/other"}]
    assert render.pod_template("svc", spec(adapters=TWO), planner.plan(spec(adapters=TWO), gpus, models)) == \
        render.pod_template("svc", spec(adapters=edited), planner.plan(spec(adapters=edited), gpus, models))


def test_without_lora_the_container_is_rendered_as_before(gpus, models):
    container = _engine(spec(), gpus, models)
    assert "--enable-lora" not in container["args"] and "workingDir" not in container


# -- which folder the engine loads ----------------------------------------------------------------------
@pytest.mark.parametrize("source, model, path, error", [
    ("adapters/sql", "pvc://models/llama", "adapters/sql", None),
    ("pvc://models/adapters/sql", "pvc://models/llama", "adapters/sql", None),
    ("sql", "hostpath:/data/llama", "sql", None),
    ("pvc://other/sql", "pvc://models/llama", None, "only the model's claim 'models' is mounted"),
    ("pvc://models/sql", "hostpath:/data/llama", None, "the model comes from a hostPath"),
    ("oci://registry/sql:1", "pvc://models/llama", "oci://registry/sql:1", None),
    ("https://example.com/adapters/sql/", "pvc://models/llama", "https://example.com/adapters/sql/", None),
    ("oci://registry/sql@sha256:" + "a" * 64, "builtin:smollm2-135m", "oci://registry/sql@sha256:" + "a" * 64, None),
    ("hf://org/sql", "pvc://models/llama", None, "hf:// adapters are not fetched"),
    ("adapters/sql", "builtin:smollm2-135m", None, "has no volume for adapter folders"),
])
def test_each_source_resolves_to_a_folder_on_the_model_volume_a_fetched_source_or_an_error(source, model, path,
                                                                                          error):
    """Folders go relative to the model volume; https:// and oci:// sources go to the engine as written (it
    fetches them, needing no volume) and come back as the `root` of its /v1/models card, so the diff is stable."""
    got = adapters.resolve(api.Adapter("sql", source), model)
    assert got.path == path
    assert (error is None and got.error is None) or (error in got.error and got.error.startswith("unsupported source"))


# -- the per-pod diff and the engine's answers -------------------------------------------------------------
def test_actions_unload_removed_and_moved_adapters_and_load_new_and_moved_ones():
    want = [Desired("keep", "a/keep"), Desired("new", "a/new"), Desired("moved", "a/moved2"), Desired("bad", None, "x")]
    loaded = {"keep": "a/keep", "gone": "a/gone", "moved": "a/moved", "bad": "a/bad"}
    assert adapters.actions(want, loaded) == adapters.Actions(("bad", "gone", "moved"),
                                                              (("new", "a/new"), ("moved", "a/moved2")))
    assert adapters.actions(want[:1], {"keep": "a/keep"}) == adapters.Actions()


def test_models_listing_gives_the_adapters_and_their_folders():
    body = {"data": [{"id": "tiny", "root": "tiny", "parent": None},
                     {"id": "sql", "root": "adapters/sql", "parent": "tiny"},
                     {"id": "web", "root": "oci://registry/web:1", "parent": "tiny"}]}
    loaded = adapters.loaded_from_models(body)
    assert loaded == {"sql": "adapters/sql", "web": "oci://registry/web:1"}
    want = [adapters.resolve(api.Adapter("web", "oci://registry/web:1"), "pvc://models/llama"),
            adapters.resolve(api.Adapter("sql", "adapters/sql"), "pvc://models/llama")]
    assert adapters.actions(want, loaded) == adapters.Actions()               # in sync: nothing to do


@pytest.mark.parametrize("code, error, result", [
    (200, None, adapters.OK), (409, {"code": "lora_adapter_in_use"}, adapters.BUSY),
    (404, {"code": "lora_adapter_not_found"}, adapters.GONE), (400, {"code": "lora_disabled"}, adapters.DISABLED),
    (400, {"code": "invalid_lora_adapter", "message": "no adapter_config.json"}, adapters.FAILED),
    (403, None, adapters.FAILED)])
def test_engine_answers_are_classified(code, error, result):
    got, message = adapters.outcome_of(code, {"error": error} if error else None)
    assert got == result and (result != adapters.FAILED or message)


# -- status, Degraded and Events --------------------------------------------------------------------------
def test_report_counts_ready_pods_and_keeps_the_first_error_and_problems_feed_degraded():
    want = [Desired("sql", "a/sql"), Desired("bad", "a/bad"), Desired("url", None, "unsupported source 'oci://x'")]
    pods = {"p1": PodResult(frozenset({"sql"}), {"bad": "rank 32 exceeds 16"}, ("loaded sql",)),
            "p0": PodResult(frozenset({"sql"}), {"bad": "rank 32 exceeds 16"})}
    entries = adapters.report(want, pods)
    assert entries == [{"name": "sql", "readyPods": 2},
                       {"name": "bad", "readyPods": 0, "lastError": "pod p0: rank 32 exceeds 16"},
                       {"name": "url", "readyPods": 0, "lastError": "unsupported source 'oci://x'"}]
    found = adapters.problems(want, entries)
    assert found == ["adapter url: unsupported source 'oci://x'", "adapter bad: pod p0: rank 32 exceeds 16"]
    assert adapters.events([], entries, pods) == [
        ("Warning", "AdapterFailed", "adapter bad: pod p0: rank 32 exceeds 16"),
        ("Warning", "AdapterFailed", "adapter url: unsupported source 'oci://x'"),
        ("Normal", "AdaptersSynced", "p1: loaded sql")]
    assert adapters.events(entries, entries, {}) == []               # the same errors again: no new Event


def test_degraded_follows_the_adapters_unless_the_plan_itself_is_degraded(gpus, models):
    plan = planner.plan(spec(adapters=TWO), gpus, models)
    patch = status.planned(plan, 1, "sel", [], "t0", ["adapter bad: no adapter_config.json"])
    degraded = next(c for c in patch["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "AdapterFailed")
    assert status.adapter_degraded(patch["conditions"], []) == status.FEASIBLE
    assert status.adapter_degraded(patch["conditions"], ["adapter bad: x"]).message == "adapter bad: x"
    limited = [{"type": "Degraded", "status": "True", "reason": "CapacityLimited"}]
    assert status.adapter_degraded(limited, ["adapter bad: x"]) is None
    assert status.adapter_degraded([{"type": "Degraded", "status": "False", "reason": "PlanFeasible"}], []) is None
