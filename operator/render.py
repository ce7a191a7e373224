"""The renderer: (name, namespace, spec, Plan) -> the Kubernetes objects of one InferenceService.

Pure: returns plain dicts (Deployment, Service, PodDisruptionBudget); the handlers add owner references
and apply them. Two runtimes: `specfleet` (our engine, flags of docs/design.md) and `vllm`
(vLLM's OpenAI server image and flags).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from importlib.metadata import version

from specfleet.operator.api import API_VERSION, KIND, InferenceServiceSpec, ModelRef, Speculation, parse_source
from specfleet.operator.cost import GiB
from specfleet.operator.planner import Plan, SpeculationPlan

# images/engine.Dockerfile, tagged like every image of this project with the package version (pyproject.toml)
SPECFLEET_IMAGE = f"ghcr.io/specfleet/engine:{version('specfleet')}"
VLLM_IMAGE = "vllm/vllm-openai:v0.10.1"      # vLLM's own image (runtime vllm), not built here
PORT = 8000
MODELS_DIR = "/models"
ADMIN_TOKEN_DIR = "/var/run/specfleet/admin"
ADMIN_TOKEN_FILE = f"{ADMIN_TOKEN_DIR}/token"
INSTANCE_LABEL = "specfleet.io/inferenceservice"
MANAGED_BY = "specfleet-operator"
DRAIN_SECONDS = 120
DRAIN_MARGIN_SECONDS = 10      # the engine finishes its drain and exits before the kubelet's SIGKILL
BUILTIN_HF = {"smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct"}   # the weights engine/builtin.py ships
VLLM_CPU_BLOCK_MULTIPLE = 32   # vLLM's CPU attention: block sizes in multiples of 32 only (0.32)


@dataclass(frozen=True)
class ModelMount:
    """How the engine reaches one model: the path or id it is given, plus pod pieces to get it there."""

    arg: str
    volumes: tuple[dict, ...] = ()
    mounts: tuple[dict, ...] = ()
    init: tuple[dict, ...] = ()
    revision: str = ""


def labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "specfleet-engine", "app.kubernetes.io/instance": name,
            "app.kubernetes.io/component": "inference-engine", "app.kubernetes.io/managed-by": MANAGED_BY,
            INSTANCE_LABEL: name}


def selector(name: str) -> dict[str, str]:
    return {INSTANCE_LABEL: name}


def selector_string(name: str) -> str:
    return ",".join(f"{k}={v}" for k, v in selector(name).items())


def admin_secret_name(name: str) -> str:
    return f"{name}-admin"


def render(name: str, namespace: str, spec: InferenceServiceSpec, plan: Plan,
           replicas: int | None = None, speculation: SpeculationPlan | None = None) -> list[dict]:
    """The Deployment, Service and PodDisruptionBudget for a planned InferenceService.

    `speculation` is the control loop's live choice where it lives in the engine args (vllm runtime).
    """
    if speculation is not None:
        plan = replace(plan, speculation=speculation)
    return [deployment(name, namespace, spec, plan, plan.replicas if replicas is None else replicas),
            service(name, namespace), disruption_budget(name, namespace)]


def with_owner(manifest: dict, owner_name: str, owner_uid: str) -> dict:
    """A copy of `manifest` owned (controller, blocking deletion) by the InferenceService."""
    ref = {"apiVersion": API_VERSION, "kind": KIND, "name": owner_name, "uid": owner_uid,
           "controller": True, "blockOwnerDeletion": True}
    meta = {**manifest["metadata"], "ownerReferences": [ref]}
    return {**manifest, "metadata": meta}


def admin_secret(name: str, namespace: str, token: str) -> dict:
    """The Secret holding the engine's admin bearer token (the token is chosen by the caller)."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": admin_secret_name(name), "namespace": namespace, "labels": labels(name)},
            "stringData": {"token": token}}


OPERATOR_NAMESPACE = "specfleet-system"
OPERATOR_LABELS = {"app.kubernetes.io/name": "specfleet-operator"}
CLIENT_LABEL = "specfleet.io/client"


def network_policy(name: str, namespace: str) -> dict:
    """Ingress to the engine pods: the operator (admin API, metrics) and labelled clients only.

    A NetworkPolicy is L4 and the admin API shares the http port, so clients that may reach the OpenAI
    API carry `specfleet.io/client: "true"` (the gateway does); the admin API also needs the bearer token.
    """
    port = [{"port": "http", "protocol": "TCP"}]
    operator = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": OPERATOR_NAMESPACE}},
                "podSelector": {"matchLabels": OPERATOR_LABELS}}
    clients = {"namespaceSelector": {}, "podSelector": {"matchLabels": {CLIENT_LABEL: "true"}}}
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": namespace, "labels": labels(name)},
            "spec": {"podSelector": {"matchLabels": selector(name)}, "policyTypes": ["Ingress"],
                     "ingress": [{"from": [operator], "ports": port}, {"from": [clients], "ports": port}]}}


def service(name: str, namespace: str) -> dict:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": namespace, "labels": labels(name)},
            "spec": {"type": "ClusterIP", "selector": selector(name),
                     "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}]}}


def disruption_budget(name: str, namespace: str) -> dict:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": namespace, "labels": labels(name)},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(name)}}}


def deployment(name: str, namespace: str, spec: InferenceServiceSpec, plan: Plan, replicas: int) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace, "labels": labels(name)},
            "spec": {"replicas": replicas, "selector": {"matchLabels": selector(name)},
                     "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                     "template": pod_template(name, spec, plan)}}


def pod_template(name: str, spec: InferenceServiceSpec, plan: Plan) -> dict:
    vllm = spec.runtime.engine == "vllm"
    model = model_mount(spec.model, "model", vllm)
    draft = _draft_mount(spec, plan, vllm)
    container = engine_container(spec, plan, model, draft)
    pod = {"serviceAccountName": "default", "automountServiceAccountToken": False,
           "terminationGracePeriodSeconds": DRAIN_SECONDS,
           "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                               "seccompProfile": {"type": "RuntimeDefault"}},
           "containers": [container],
           "volumes": _volumes(name, plan, model, draft, vllm)}
    if model.init or (draft and draft.init):
        pod["initContainers"] = [*model.init, *(draft.init if draft else ())]
    if plan.gpu_resource:
        pod["tolerations"] = [{"key": plan.gpu_resource, "operator": "Exists", "effect": "NoSchedule"}]
    return {"metadata": {"labels": labels(name),
                         "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": str(PORT),
                                         "prometheus.io/path": "/metrics"}},
            "spec": pod}


def engine_container(spec: InferenceServiceSpec, plan: Plan, model: ModelMount, draft: ModelMount | None) -> dict:
    vllm = spec.runtime.engine == "vllm"
    args = vllm_args(spec, plan, model, draft) if vllm else specfleet_args(spec, plan, model, draft)
    mounts = [{"name": "tmp", "mountPath": "/tmp"}, {"name": "shm", "mountPath": "/dev/shm"},
              *model.mounts, *(draft.mounts if draft else ())]
    if not vllm:
        mounts.append({"name": "admin-token", "mountPath": ADMIN_TOKEN_DIR, "readOnly": True})
    return {"name": "engine", "image": spec.runtime.image or (VLLM_IMAGE if vllm else SPECFLEET_IMAGE),
            "command": ["vllm", "serve"] if vllm else ["specfleet", "engine", "serve"],
            "args": [*args, *spec.runtime.extra_args],
            "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
            "env": _env(plan),
            "resources": resources(plan),
            "startupProbe": _probe("/health", period=10, failures=180),
            "readinessProbe": _probe("/health" if vllm else "/ready", period=5, failures=3),
            "livenessProbe": _probe("/health", period=10, failures=3),
            "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
            "volumeMounts": mounts, **_working_dir(spec)}


def model_volume(spec: InferenceServiceSpec) -> str | None:
    """Where the model's volume is mounted (a PVC's root, a hostPath folder); None for sources without one."""
    return f"{MODELS_DIR}/model" if parse_source(spec.model.source).kind in ("pvc", "hostpath") else None


def _working_dir(spec: InferenceServiceSpec) -> dict:
    """With LoRA on, the engine runs in the model volume, so the adapter folders the operator loads at run
    time go by paths relative to it (the same on a cluster and on the local fleet, which maps the mount);
    without LoRA the container is rendered as before."""
    volume = model_volume(spec) if spec.lora_limits is not None else None
    return {"workingDir": volume} if volume else {}


def lora_args(spec: InferenceServiceSpec) -> list[str]:
    """The engine's static LoRA flags: the adapter list is loaded live, never rendered, so editing it rolls
    no pod."""
    limits = spec.lora_limits
    if limits is None:
        return []
    args = ["--enable-lora", "--max-loras", str(limits.max_loras), "--max-lora-rank", str(limits.max_lora_rank)]
    return args + (["--max-cpu-loras", str(limits.max_cpu_loras)] if limits.max_cpu_loras is not None else [])


def specfleet_args(spec: InferenceServiceSpec, plan: Plan, model: ModelMount, draft: ModelMount | None) -> list[str]:
    """`specfleet engine serve` flags: docs/design.md, plus the TTFT target (deadline-ordered admission) and the
    ITL target, which with it decides whether a served request counts as meeting the SLO (the error budget)."""
    args = ["--model", model.arg, "--served-model-name", spec.model.name, "--port", str(PORT),
            "--dtype", spec.model.dtype, "--block-size", str(plan.block_size),
            "--num-kv-blocks", str(plan.kv_cache_blocks), "--max-num-seqs", str(plan.max_num_seqs),
            "--max-num-batched-tokens", str(plan.max_num_batched_tokens), "--enable-prefix-caching",
            "--ttft-deadline-ms", f"{spec.slo.ttft_p99_ms:g}", "--itl-target-ms", f"{spec.slo.itl_p99_ms:g}",
            "--drain-timeout", f"{DRAIN_SECONDS - DRAIN_MARGIN_SECONDS}"]
    sp = plan.speculation
    if sp.method is not None and sp.k > 0:
        args += ["--speculative-method", sp.method]
        args += ["--draft-model", draft.arg] if draft else []
        args += ["--num-speculative-tokens", str(sp.k), "--speculation-enabled", str(sp.enabled).lower()]
        # the control loop retunes k live up to maxSpeculativeTokens; the engine refuses any deeper k
        args += ["--max-speculative-tokens", str(max(sp.k, spec.speculation.max_speculative_tokens))]
        args += ngram_args(spec.speculation) if sp.method == "ngram" else []
    return args + lora_args(spec) + ["--admin-token-file", ADMIN_TOKEN_FILE]


def ngram_args(sp: Speculation) -> list[str]:
    """The n-gram match bounds, only where they differ from the defaults (the engine's too): flags that
    restate defaults would change every existing pod template, and an upgrade would roll them for nothing."""
    default = Speculation()
    args = ["--prompt-lookup-min", str(sp.prompt_lookup_min)] if sp.prompt_lookup_min != default.prompt_lookup_min else []
    if sp.prompt_lookup_max != default.prompt_lookup_max:
        args += ["--prompt-lookup-max", str(sp.prompt_lookup_max)]
    return args


def vllm_args(spec: InferenceServiceSpec, plan: Plan, model: ModelMount, draft: ModelMount | None) -> list[str]:
    """`vllm serve` flags; vLLM cannot toggle speculation live, so it is on in the args or absent."""
    args = [model.arg, "--served-model-name", spec.model.name, "--port", str(PORT),
            "--tensor-parallel-size", str(plan.tensor_parallel_size), "--max-num-seqs", str(plan.max_num_seqs),
            "--max-num-batched-tokens", str(plan.max_num_batched_tokens), *vllm_kv_args(plan),
            "--enable-prefix-caching", *vllm_dtype_args(spec.model.dtype)]
    args += ["--revision", model.revision] if model.revision else []
    sp = plan.speculation
    if sp.enabled and sp.k > 0:
        config = {"method": sp.method, "num_speculative_tokens": sp.k}
        if sp.method == "ngram":
            # both bounds: given only the max, vLLM takes the min equal to it
            config.update(prompt_lookup_min=spec.speculation.prompt_lookup_min,
                          prompt_lookup_max=spec.speculation.prompt_lookup_max)
        else:
            config = {"model": draft.arg, "num_speculative_tokens": sp.k}
        args += ["--speculative-config", json.dumps(config, sort_keys=True, separators=(",", ":"))]
    return args


def vllm_kv_args(plan: Plan) -> list[str]:
    """The plan's KV pool as vLLM takes it. GPUs: the fraction of GPU memory it fills. CPU: in bytes, since
    there `--gpu-memory-utilization` is the share of the host's RAM vLLM reserves (0.90 of the node), in
    blocks rounded up to vLLM's CPU multiple (the same bytes in fewer, larger blocks)."""
    if plan.gpu_resource:
        return ["--gpu-memory-utilization", f"{plan.gpu_memory_utilization:.2f}", "--block-size", str(plan.block_size)]
    kv_bytes = plan.kv_cache_blocks * plan.block_size * plan.kv_bytes_per_token
    block = -(-plan.block_size // VLLM_CPU_BLOCK_MULTIPLE) * VLLM_CPU_BLOCK_MULTIPLE
    return ["--kv-cache-memory-bytes", str(kv_bytes), "--block-size", str(block)]


def vllm_dtype_args(dtype: str) -> list[str]:
    """The declared dtype as vLLM takes it: fp8 is a quantization of weights and KV cache (the plan sizes
    both at one byte), the others are `--dtype`."""
    return ["--quantization", "fp8", "--kv-cache-dtype", "fp8"] if dtype == "fp8" else ["--dtype", dtype]


def model_mount(model: ModelRef, role: str, vllm: bool) -> ModelMount:
    """Where the engine finds a model, by source kind (role: "model" or "draft")."""
    src = parse_source(model.source)
    path = f"{MODELS_DIR}/{role}"
    if src.kind == "builtin":
        return ModelMount(BUILTIN_HF.get(src.location, src.location) if vllm else src.location)
    if src.kind == "image":
        return ModelMount(src.location)
    if src.kind == "pvc":
        volume = {"name": f"{role}-pvc", "persistentVolumeClaim": {"claimName": src.location, "readOnly": True}}
        mount = {"name": f"{role}-pvc", "mountPath": path, "readOnly": True}
        return ModelMount(f"{path}/{src.path}".rstrip("/"), (volume,), (mount,))
    if src.kind == "hostpath":
        volume = {"name": f"{role}-host", "hostPath": {"path": src.location, "type": "Directory"}}
        return ModelMount(path, (volume,), ({"name": f"{role}-host", "mountPath": path, "readOnly": True},))
    if vllm:
        return ModelMount(src.location, revision=src.revision)
    return _hf_mount(src.location, src.revision, role, path)


def _hf_mount(repo: str, revision: str, role: str, path: str) -> ModelMount:
    volume = {"name": f"{role}-files", "emptyDir": {}}
    mount = {"name": f"{role}-files", "mountPath": path}
    fetch = ["hf", "download", repo, "--local-dir", path] + (["--revision", revision] if revision else [])
    init = {"name": f"fetch-{role}", "image": SPECFLEET_IMAGE, "command": fetch,
            "env": [{"name": "HF_HOME", "value": "/tmp/hf"},
                    {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token",
                                                                        "optional": True}}}],
            "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
            "volumeMounts": [mount, {"name": "tmp", "mountPath": "/tmp"}]}
    return ModelMount(path, (volume,), (mount,), (init,))


def _draft_mount(spec: InferenceServiceSpec, plan: Plan, vllm: bool) -> ModelMount | None:
    sp = spec.speculation
    if plan.speculation.method != "draft" or sp.draft_model is None:
        return None
    return model_mount(sp.draft_model, "draft", vllm)


def _volumes(name: str, plan: Plan, model: ModelMount, draft: ModelMount | None, vllm: bool) -> list[dict]:
    shm = {"medium": "Memory", "sizeLimit": f"{max(1, plan.tensor_parallel_size) * 2}Gi"}
    volumes = [{"name": "tmp", "emptyDir": {}}, {"name": "shm", "emptyDir": shm},
               *model.volumes, *(draft.volumes if draft else ())]
    if not vllm:
        volumes.append({"name": "admin-token", "secret": {"secretName": admin_secret_name(name),
                                                          "defaultMode": 0o440}})
    return volumes


def _env(plan: Plan) -> list[dict]:
    env = [{"name": "HOME", "value": "/tmp"}, {"name": "HF_HOME", "value": "/tmp/hf"},
           {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token",
                                                               "optional": True}}}]
    if plan.gpu_resource is None:
        env.append({"name": "CUDA_VISIBLE_DEVICES", "value": ""})
    return env


CPU_WEIGHT_COPIES = 2


def resources(plan: Plan) -> dict:
    """GPUs for GPU plans; for `cpu` the host memory holds weights and the KV pool."""
    if plan.gpu_resource:
        memory = math.ceil(plan.weights_bytes / plan.gpus_per_replica / GiB) + 16
        requests = {"cpu": str(4 * plan.gpus_per_replica), "memory": f"{memory * plan.gpus_per_replica}Gi"}
        return {"requests": {**requests, plan.gpu_resource: str(plan.gpus_per_replica)},
                "limits": {plan.gpu_resource: str(plan.gpus_per_replica), "memory": requests["memory"]}}
    kv = plan.kv_cache_blocks * plan.block_size * plan.kv_bytes_per_token
    # the CPU engine holds its linears twice: oneDNN-packed and plain, for few-row steps (engine/cpu/linear.py)
    memory = f"{math.ceil((CPU_WEIGHT_COPIES * plan.weights_bytes + kv + plan.lora_slot_bytes) / GiB) + 1}Gi"
    return {"requests": {"cpu": "2", "memory": memory}, "limits": {"memory": memory}}


def _probe(path: str, period: int, failures: int) -> dict:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period, "failureThreshold": failures,
            "timeoutSeconds": 5}
