"""The renderer: engine flags from the plan, pod hardening, Service and PDB."""
from __future__ import annotations

import json

from specfleet.operator import planner, render


def _flags(args: list[str]) -> dict[str, str | None]:
    out, i = {}, 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[args[i]] = args[i + 1]
            i += 2
        else:
            out[args[i]] = None
            i += 1
    return out


def _render(make_spec, gpus, models, **over):
    spec = make_spec(**over)
    plan = planner.plan(spec, gpus, models)
    return spec, plan, render.render("svc", "ns", spec, plan)


def test_specfleet_args_are_exactly_the_engine_contract(make_spec, gpus, models):
    _, plan, (deploy, _, _) = _render(make_spec, gpus, models, speculation={"mode": "on"})
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["specfleet", "engine", "serve"]
    flags = _flags(container["args"])
    assert flags == {"--model": "/models/model", "--served-model-name": "m", "--port": "8000", "--block-size": "16",
                     "--dtype": "bfloat16",             # what the plan sized weights and KV cache by
                     "--num-kv-blocks": str(plan.kv_cache_blocks), "--max-num-seqs": str(plan.max_num_seqs),
                     "--max-num-batched-tokens": str(plan.max_num_batched_tokens), "--enable-prefix-caching": None,
                     "--ttft-deadline-ms": "1000",     # beyond docs/design.md §3: the SLO's TTFT for deadline admission
                     "--itl-target-ms": "30",           # the ITL SLO: with the TTFT, what counts as a met request
                     "--drain-timeout": "110",          # drained and exited within the pod's 120 s grace period
                     "--speculative-method": "ngram", "--num-speculative-tokens": str(plan.speculation.k),
                     "--speculation-enabled": "true", "--admin-token-file": render.ADMIN_TOKEN_FILE,
                     "--max-speculative-tokens": "8"}   # the live retuning's ceiling: maxSpeculativeTokens


def test_hf_sources_are_fetched_by_an_init_container(make_spec, gpus, models):
    _, _, (deploy, _, _) = _render(make_spec, gpus, models,
                                   model={"source": "hf://meta-llama/Llama-3.1-8B-Instruct@abc123"})
    init = deploy["spec"]["template"]["spec"]["initContainers"][0]
    assert init["command"][:3] == ["hf", "download", "meta-llama/Llama-3.1-8B-Instruct"]
    assert init["command"][-2:] == ["--revision", "abc123"]


def test_the_builtin_model_runs_on_cpu_without_gpu_resources(make_spec, gpus, models):
    _, _, (deploy, _, _) = _render(make_spec, gpus, models, model={"source": "builtin:smollm2-135m"},
                                   accelerator={"type": "cpu"}, slo={"itlP99Ms": 200, "ttftP99Ms": 3000})
    pod = deploy["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert _flags(container["args"])["--model"] == "smollm2-135m"
    assert "nvidia.com/gpu" not in json.dumps(container["resources"]) and "tolerations" not in pod


def test_a_cpu_pod_requests_cores_and_the_memory_of_both_copies_of_its_weights_and_its_kv_pool(make_spec, gpus,
                                                                                              models):
    _, plan, (deploy, _, _) = _render(make_spec, gpus, models, model={"source": "builtin:smollm2-135m"},
                                      accelerator={"type": "cpu"}, slo={"itlP99Ms": 200, "ttftP99Ms": 3000})
    resources = deploy["spec"]["template"]["spec"]["containers"][0]["resources"]
    footprint = 2 * plan.weights_bytes + plan.kv_cache_blocks * plan.block_size * plan.kv_bytes_per_token
    memory_gib = int(resources["requests"]["memory"].removesuffix("Gi"))
    assert footprint / 2**30 < memory_gib <= footprint / 2**30 + 2
    assert resources["requests"]["cpu"] == "2" and resources["limits"]["memory"] == resources["requests"]["memory"]


def test_gpu_plans_request_their_gpus(make_spec, gpus, models):
    _, plan, (deploy, _, _) = _render(make_spec, gpus, models)
    limits = deploy["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == str(plan.gpus_per_replica)


def test_speculation_off_renders_no_speculative_flags(make_spec, gpus, models):
    _, _, (deploy, _, _) = _render(make_spec, gpus, models, speculation={"mode": "off"})
    assert not any(a.startswith("--spec") for a in deploy["spec"]["template"]["spec"]["containers"][0]["args"])


def test_vllm_gets_its_image_tp_and_speculative_config(make_spec, gpus, models):
    _, plan, (deploy, _, _) = _render(make_spec, gpus, models, runtime={"engine": "vllm"}, accelerator={"count": 2},
                                      speculation={"mode": "on"})
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == render.VLLM_IMAGE and container["command"] == ["vllm", "serve"]
    assert container["args"][0] == "meta-llama/Llama-3.1-8B-Instruct"
    flags = _flags(container["args"][1:])
    assert flags["--tensor-parallel-size"] == "2" and flags["--gpu-memory-utilization"] == "0.90"
    assert json.loads(flags["--speculative-config"]) == {"method": "ngram", "num_speculative_tokens": plan.speculation.k,
                                                         "prompt_lookup_min": 2, "prompt_lookup_max": 4}


def test_both_runtimes_run_the_declared_dtype(make_spec, gpus, models):
    def args_of(dtype, engine="specfleet"):
        _, _, (deploy, _, _) = _render(make_spec, gpus, models, runtime={"engine": engine},
                                       model={"name": "m", "source": "builtin:smollm2-135m", "dtype": dtype},
                                       accelerator={"type": "cpu"}, slo={"itlP99Ms": 200, "ttftP99Ms": 3000})
        return _flags(deploy["spec"]["template"]["spec"]["containers"][0]["args"][1:])

    assert args_of("float32")["--dtype"] == "float32" and args_of("bfloat16", "vllm")["--dtype"] == "bfloat16"
    fp8 = args_of("fp8", "vllm")
    assert "--dtype" not in fp8 and fp8["--quantization"] == "fp8" and fp8["--kv-cache-dtype"] == "fp8"


def test_the_ngram_match_bounds_reach_the_engine_only_when_declared(make_spec, gpus, models):
    def args_of(**speculation):
        _, _, (deploy, _, _) = _render(make_spec, gpus, models, speculation={"mode": "on", **speculation})
        return _flags(deploy["spec"]["template"]["spec"]["containers"][0]["args"])

    assert "--prompt-lookup-min" not in args_of() and "--prompt-lookup-max" not in args_of()
    declared = args_of(promptLookupMin=1, promptLookupMax=3)
    assert declared["--prompt-lookup-min"] == "1" and declared["--prompt-lookup-max"] == "3"


def test_draft_speculation_mounts_the_draft_model(make_spec, gpus, models):
    draft = {"name": "d", "source": "pvc://models/llama-3.2-1b"}
    _, plan, (deploy, _, _) = _render(make_spec, gpus, models,
                                      speculation={"mode": "on", "method": "draft", "draftModel": draft})
    args = _flags(deploy["spec"]["template"]["spec"]["containers"][0]["args"])
    assert plan.speculation.method == "draft" and args["--draft-model"] == "/models/draft/llama-3.2-1b"


def test_pods_are_hardened_probed_scraped_and_drained(make_spec, gpus, models):
    _, _, (deploy, _, _) = _render(make_spec, gpus, models)
    template = deploy["spec"]["template"]
    pod, container = template["spec"], template["spec"]["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] and pod["terminationGracePeriodSeconds"] >= 60
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert template["metadata"]["annotations"]["prometheus.io/scrape"] == "true"


def test_service_and_pdb_select_the_engine_pods(make_spec, gpus, models):
    _, _, (deploy, svc, pdb) = _render(make_spec, gpus, models)
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert render.selector_string("svc") == "specfleet.io/inferenceservice=svc"


def test_owner_references_make_the_service_the_controller(make_spec, gpus, models):
    _, _, (deploy, _, _) = _render(make_spec, gpus, models)
    owned = render.with_owner(deploy, "svc", "uid-1")
    ref = owned["metadata"]["ownerReferences"][0]
    assert ref["kind"] == "InferenceService" and ref["uid"] == "uid-1" and ref["controller"]
    assert "ownerReferences" not in deploy["metadata"]       # pure: the input is untouched


def test_extra_args_come_last(make_spec, gpus, models):
    _, _, (deploy, _, _) = _render(make_spec, gpus, models, runtime={"extraArgs": ["--seed", "7"]})
    assert deploy["spec"]["template"]["spec"]["containers"][0]["args"][-2:] == ["--seed", "7"]
