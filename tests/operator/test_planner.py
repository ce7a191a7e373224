"""The SLO planner: hand-computed cases, infeasibility with reasons, and monotonicity properties."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specfleet.operator import api, planner
from specfleet.operator.catalogs import parse_gpus

LLAMA70 = {"model": {"source": "hf://meta-llama/Llama-3.1-70B-Instruct"}, "runtime": {"engine": "vllm"},
           "accelerator": {"count": 4},
           "slo": {"ttftP99Ms": 2000, "itlP99Ms": 50, "maxContextTokens": 8192, "promptTokens": 2000,
                   "outputTokens": 500, "requestsPerSecond": 10}}


def test_llama70b_on_4_h100_plans_320_kib_per_token_and_141_gb_of_weights(make_spec, gpus, models):
    plan = planner.plan(make_spec(**LLAMA70), gpus, models)
    assert isinstance(plan, planner.Plan)
    assert plan.kv_bytes_per_token == 320 * 1024
    assert 140e9 <= plan.weights_bytes <= 141.2e9          # 70.55 B parameters x 2 bytes
    assert (plan.gpus_per_replica, plan.tensor_parallel_size) == (4, 4)
    # 4 x 80 GiB x 0.9 - 141.1 GB - reserve (4 GiB overhead + activations): ~31 k blocks of 16 tokens.
    assert 30_000 < plan.kv_cache_blocks < 31_460
    assert plan.predicted.itl_p99_ms <= 50 and plan.predicted.ttft_p99_ms <= 2000
    assert plan.max_num_seqs * 2500 <= plan.kv_cache_blocks * 16     # the batch fits in the KV pool


def test_auto_count_picks_a_tensor_parallel_size_that_fits_70b(make_spec, gpus, models):
    plan = planner.plan(make_spec(**{**LLAMA70, "accelerator": {"count": "auto"}}), gpus, models)
    assert isinstance(plan, planner.Plan) and plan.tensor_parallel_size >= 2


def test_70b_on_one_gpu_is_infeasible_for_memory(make_spec, gpus, models):
    result = planner.plan(make_spec(**{**LLAMA70, "accelerator": {"count": 1}}), gpus, models)
    assert isinstance(result, planner.Infeasible) and result.reason == "InsufficientMemory"


def test_the_specfleet_engine_refuses_tensor_parallelism(make_spec, gpus, models):
    result = planner.plan(make_spec(runtime={"engine": "specfleet"}, accelerator={"count": 2}), gpus, models)
    assert isinstance(result, planner.Infeasible) and result.reason == "TensorParallelUnsupported"


def test_an_unreachable_itl_says_why_with_the_closest_feasible_target(make_spec, gpus, models):
    result = planner.plan(make_spec(slo={"itlP99Ms": 2}), gpus, models)
    assert isinstance(result, planner.Infeasible) and result.reason == "ITLUnreachable"
    assert "itlP99Ms" in result.closest and result.closest["itlP99Ms"] > 2
    relaxed = planner.plan(make_spec(slo={"itlP99Ms": result.closest["itlP99Ms"] + 1}), gpus, models)
    assert isinstance(relaxed, planner.Plan)


def test_an_unreachable_ttft_says_why(make_spec, gpus, models):
    result = planner.plan(make_spec(slo={"ttftP99Ms": 1, "promptTokens": 3000}), gpus, models)
    assert isinstance(result, planner.Infeasible) and result.reason == "TTFTUnreachable"
    assert result.closest["ttftP99Ms"] > 1


def test_unknown_model_and_accelerator_are_named(make_spec, gpus, models):
    unknown = planner.plan(make_spec(model={"source": "hf://acme/mystery-9b"}), gpus, models)
    assert unknown.reason == "UnknownModel"
    assert planner.plan(make_spec(accelerator={"type": "tpu-v5"}), gpus, models).reason == "UnknownAccelerator"


def test_an_inline_architecture_replaces_the_catalog(make_spec, gpus, models):
    arch = {"numLayers": 16, "hiddenSize": 2048, "numAttentionHeads": 32, "numKvHeads": 8, "headDim": 64,
            "intermediateSize": 8192, "vocabSize": 128256, "parameters": 1235814400}
    plan = planner.plan(make_spec(model={"source": "hf://acme/mystery-1b", "architecture": arch}), gpus, models)
    assert plan.kv_bytes_per_token == 2 * 16 * 8 * 64 * 2


def test_speculation_off_plans_no_method(make_spec, gpus, models):
    plan = planner.plan(make_spec(speculation={"mode": "off"}), gpus, models)
    assert plan.speculation == planner.SpeculationPlan(False, None, 0)


def test_speculation_on_is_enabled_even_when_auto_would_not(make_spec, gpus, models):
    plan = planner.plan(make_spec(speculation={"mode": "on", "minAcceptanceRate": 0.05}), gpus, models)
    assert plan.speculation.enabled and plan.speculation.k >= 1


def test_auto_speculation_turns_off_when_acceptance_is_too_low_to_pay(make_spec, gpus, models):
    plan = planner.plan(make_spec(speculation={"minAcceptanceRate": 0.0}), gpus, models)
    assert not plan.speculation.enabled


def test_replicas_cover_the_declared_load_within_max(make_spec, gpus, models):
    light = planner.plan(make_spec(slo={"requestsPerSecond": 0.1}), gpus, models)
    heavy = planner.plan(make_spec(slo={"requestsPerSecond": 500}, autoscaling={"maxReplicas": 3}), gpus, models)
    assert light.replicas == 1 and not light.warnings
    assert heavy.replicas == 3 and any("maxReplicas" in w for w in heavy.warnings)


def test_a_prefill_bound_service_gets_the_replicas_the_autoscaler_would_ask_for(gpus, models):
    """1000-token prompts, 300-token answers: slots alone (Little's law) would give 8 replicas for
    240 req/s; the prefill rate at the autoscaler's utilization (what it sizes by) needs more."""
    from specfleet.operator import api
    from specfleet.operator.capacity import service_model
    from specfleet.sim import scenarios

    doc = {**scenarios.SERVICE, "slo": {**scenarios.SERVICE["slo"], "requestsPerSecond": 240}}
    spec = api.parse_spec(doc)
    plan = planner.plan(spec, gpus, models)
    from specfleet.operator.control.autoscaler import ScalingPolicy

    per = service_model(spec, plan, gpus, models).replica_rps(ScalingPolicy.target_utilization)
    assert plan.replicas == -(-240 // per) and plan.replicas > 8 and not plan.warnings


def test_speculation_starts_where_the_controller_would_keep_it(gpus, models):
    """On a prefill-bound service draft tokens take prompt budget: at 240 req/s speculating would cost
    replicas, so the plan starts with it off (k kept for later); at 4 req/s one replica has room to
    spare and it starts on."""
    from specfleet.operator import api
    from specfleet.operator.capacity import service_model
    from specfleet.sim import scenarios

    def at(rps):
        spec = api.parse_spec({**scenarios.SERVICE, "slo": {**scenarios.SERVICE["slo"], "requestsPerSecond": rps}})
        return spec, planner.plan(spec, gpus, models)

    spec, busy = at(240)
    model = service_model(spec, busy, gpus, models)
    assert model.replica_rps(0.9, 0.5, max(busy.speculation.k, 1)) < model.replica_rps(0.9)
    assert not busy.speculation.enabled and busy.speculation.method == "ngram" and busy.speculation.k >= 1
    _, light = at(4)
    assert light.speculation.enabled and light.replicas == 1


def test_fixed_replicas_win_over_the_load(make_spec, gpus, models):
    assert planner.plan(make_spec(replicas=5), gpus, models).replicas == 5


def test_builtin_model_plans_on_cpu(make_spec, gpus, models):
    plan = planner.plan(make_spec(model={"source": "builtin:smollm2-135m"}, accelerator={"type": "cpu"},
                                  slo={"itlP99Ms": 200, "ttftP99Ms": 3000, "maxContextTokens": 2048,
                                       "promptTokens": 256, "outputTokens": 128}), gpus, models)
    assert isinstance(plan, planner.Plan) and plan.gpu_resource is None and plan.gpus_per_replica == 1


def _gpu_with_memory(gib: float):
    return parse_gpus({"g": {"memoryGiB": gib, "hbmBandwidthGBps": 3350, "bf16TFLOPS": 989}})


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(small=st.floats(24, 200), extra=st.floats(0, 200))
def test_more_gpu_memory_never_plans_fewer_blocks(make_spec, models, small, extra):
    spec = make_spec(accelerator={"type": "g", "count": 1})
    a, b = planner.plan(spec, _gpu_with_memory(small), models), planner.plan(spec, _gpu_with_memory(small + extra), models)
    if isinstance(a, planner.Plan):
        assert isinstance(b, planner.Plan) and b.kv_cache_blocks >= a.kv_cache_blocks


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(itl=st.floats(8, 120), tighter=st.floats(0.2, 1.0))
def test_a_tighter_itl_never_plans_a_larger_batch(make_spec, gpus, models, itl, tighter):
    loose = planner.plan(make_spec(accelerator={"count": 1}, slo={"itlP99Ms": itl}), gpus, models)
    tight = planner.plan(make_spec(accelerator={"count": 1}, slo={"itlP99Ms": itl * tighter}), gpus, models)
    if isinstance(tight, planner.Plan):
        assert isinstance(loose, planner.Plan) and tight.max_num_seqs <= loose.max_num_seqs


def test_every_catalog_model_plans_somewhere(gpus, models):
    for name in ("llama-3.1-8b", "qwen2.5-7b", "qwen3-8b", "mistral-7b", "smollm2-135m"):
        spec = api.parse_spec({"model": {"name": "x", "source": f"hf://x/{name}"}, "runtime": {"engine": "vllm"},
                               "slo": {"ttftP99Ms": 2000, "itlP99Ms": 60}})
        assert isinstance(planner.plan(spec, gpus, models), planner.Plan), name


def test_the_simulators_service_plans_at_the_additive_roofline(gpus, models):
    """Llama-3.1-8B on one H100 at ITL 25 ms, TTFT 1 s, 1000-token prompts (sim/scenarios.py): the decode batch takes
    most of the ITL target and the prompts the rest, 166 sequences and a 192-token budget, and 60 req/s needs 9
    replicas (docs/speculation-gpu.md; under `max(memory, compute)` it was 251, 800 and 3)."""
    from specfleet.sim import scenarios

    spec = api.parse_spec({**scenarios.SERVICE, "slo": {**scenarios.SERVICE["slo"], "requestsPerSecond": 60}})
    plan = planner.plan(spec, gpus, models)
    assert (plan.max_num_seqs, plan.max_num_batched_tokens, plan.replicas) == (166, 192, 9)
