"""The InferenceService resource (specfleet.io/v1alpha1) as typed, validated dataclasses.

`parse_spec(dict) -> InferenceServiceSpec` applies the CRD's defaults and checks every rule the CRD
schema and its CEL rules state, so a cluster without CEL (or `specfleet plan` with no cluster at all)
rejects the same specs. Errors come back together in one `SpecError`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from specfleet.operator.cost.shapes import Architecture  # spec.model.architecture

GROUP = "specfleet.io"
VERSION = "v1alpha1"
PLURAL = "inferenceservices"
KIND = "InferenceService"
API_VERSION = f"{GROUP}/{VERSION}"

ENGINES = ("specfleet", "vllm")
SPEC_MODES = ("auto", "on", "off")
SPEC_METHODS = ("ngram", "draft")
DTYPES = ("bfloat16", "float16", "float32", "fp8")
SOURCE_RE = re.compile(
    r"^(hf://[\w.\-]+/[\w.\-]+(@[\w.\-/]+)?|pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/.*)?"
    r"|hostpath:/.+|image:/.+|builtin:[a-z0-9][a-z0-9.\-]*)$")
ADAPTER_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
# a folder relative to the model volume, pvc://claim/path, or a URL (validated here, fetched by nothing yet)
ADAPTER_SOURCE_RE = re.compile(r"^(pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?/.+|(oci|https?|hf)://.+|[\w.\-]+(/[\w.\-]+)*)$")
MAX_ADAPTERS = 256
MAX_LORA_RANK = 512
ARCH_FIELDS = {"numLayers": "num_layers", "hiddenSize": "hidden_size",
               "numAttentionHeads": "num_attention_heads", "numKvHeads": "num_kv_heads",
               "headDim": "head_dim", "intermediateSize": "intermediate_size",
               "vocabSize": "vocab_size", "parameters": "parameters"}


class SpecError(ValueError):
    """A spec that breaks the CRD's rules; `errors` lists every broken rule."""

    def __init__(self, errors: list[str]):
        super().__init__("; ".join(errors))
        self.errors = errors


@dataclass(frozen=True)
class Source:
    """A parsed `model.source`: kind is hf | pvc | hostpath | image | builtin."""

    kind: str
    location: str            # hf repo id, pvc claim, a path, or the builtin name
    path: str = ""           # path inside the pvc
    revision: str = ""       # hf revision


@dataclass(frozen=True)
class ModelRef:
    name: str
    source: str
    architecture: Architecture | None = None
    dtype: str = "bfloat16"


@dataclass(frozen=True)
class Runtime:
    engine: str = "specfleet"
    image: str | None = None
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Accelerator:
    type: str = "nvidia-h100-80gb"
    count: int | None = None    # None: auto


@dataclass(frozen=True)
class Slo:
    ttft_p99_ms: float
    itl_p99_ms: float
    max_context_tokens: int = 4096
    prompt_tokens: int = 1024
    output_tokens: int = 256
    requests_per_second: float = 1.0
    objective: float = 0.99     # share of requests that must meet both targets (the error budget's complement)


@dataclass(frozen=True)
class Speculation:
    mode: str = "auto"
    method: str = "ngram"
    draft_model: ModelRef | None = None
    max_speculative_tokens: int = 8
    min_acceptance_rate: float = 0.5
    prompt_lookup_min: int = 2      # n-gram drafts match context suffixes of max down to min tokens
    prompt_lookup_max: int = 4


@dataclass(frozen=True)
class Autoscaling:
    min_replicas: int = 1
    max_replicas: int = 4
    scale_up_stabilization_seconds: int = 30
    scale_down_stabilization_seconds: int = 300
    idle_seconds: int | None = None     # scale to 0 after this long without requests (minReplicas 0 only)


@dataclass(frozen=True)
class Adapter:
    """One `spec.adapters[]` entry: a PEFT LoRA folder served under `name` (the request's `model`)."""

    name: str
    source: str
    rank: int | None = None         # declared rank (checked against lora.maxLoraRank); None: the folder's


@dataclass(frozen=True)
class LoRA:
    """`spec.lora`: the engine's static LoRA limits (in the pod template; the adapter list is not)."""

    max_loras: int = 4              # adapter slots in one batch
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None   # None: the engine's default (max_loras)


MODES = ("Serving", "PlanOnly")


@dataclass(frozen=True)
class InferenceServiceSpec:
    model: ModelRef
    slo: Slo
    runtime: Runtime = field(default_factory=Runtime)
    accelerator: Accelerator = field(default_factory=Accelerator)
    speculation: Speculation = field(default_factory=Speculation)
    autoscaling: Autoscaling = field(default_factory=Autoscaling)
    replicas: int | None = None
    mode: str = "Serving"      # PlanOnly: plan and report the actions, create nothing
    adapters: tuple[Adapter, ...] = ()
    lora: LoRA | None = None   # None: spec.lora absent (LoRA is still on while adapters are declared)

    @property
    def plan_only(self) -> bool:
        return self.mode == "PlanOnly"

    @property
    def lora_limits(self) -> LoRA | None:
        """The LoRA limits the engine runs with; None: LoRA off (no spec.lora, no adapters)."""
        return self.lora or (LoRA() if self.adapters else None)


@dataclass(frozen=True)
class Condition:
    """A status condition, Kubernetes-style (status is "True" | "False" | "Unknown")."""

    type: str
    status: str
    reason: str
    message: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"type": self.type, "status": self.status, "reason": self.reason, "message": self.message}


CONDITION_TYPES = ("Ready", "Progressing", "Degraded", "SLOMet", "SLOAtRisk", "SpeculationActive", "Schedulable",
                   "MetricsSource")


def token_defaults(max_context: int, prompt: int | None, output: int | None) -> tuple[int, int]:
    """promptTokens and outputTokens with their defaults (1024, 256) for those not given, scaled into
    `max_context` when they would not fit: both in the defaults' 4:1 ratio, or one into what the other
    leaves (at least 1; a given pair that does not fit is the caller's error to report)."""
    default_prompt, default_output = Slo.prompt_tokens, Slo.output_tokens
    if prompt is None and output is None:
        if default_prompt + default_output <= max_context:
            return default_prompt, default_output
        prompt = max(1, max_context * default_prompt // (default_prompt + default_output))
        return prompt, max(1, max_context - prompt)
    if prompt is None:
        return min(default_prompt, max(1, max_context - output)), output
    if output is None:
        return prompt, min(default_output, max(1, max_context - prompt))
    return prompt, output


def parse_source(source: str) -> Source:
    """Split a validated `model.source` string into its parts."""
    scheme, _, rest = source.partition(":")
    if scheme == "hf":
        repo, _, revision = rest.removeprefix("//").partition("@")
        return Source("hf", repo, revision=revision)
    if scheme == "pvc":
        claim, _, path = rest.removeprefix("//").partition("/")
        return Source("pvc", claim, path=path)
    return Source(scheme, rest)


def parse_spec(raw: Mapping[str, Any]) -> InferenceServiceSpec:
    """Build a typed spec from the CR's `.spec`, with defaults; raises SpecError listing every problem."""
    errors: list[str] = []
    reader = _Reader(errors)
    spec = reader.spec(raw or {})
    errors += cross_field_errors(spec) if spec is not None else []
    if errors:
        raise SpecError(errors)
    return spec


FP8_RULE = "model.dtype fp8 needs runtime.engine vllm: the specfleet engine serves bfloat16, float16 and float32"


def cross_field_errors(spec: InferenceServiceSpec) -> list[str]:
    """The CRD's CEL rules, in Python."""
    errors = []
    slo, auto, sp = spec.slo, spec.autoscaling, spec.speculation
    if slo.prompt_tokens + slo.output_tokens > slo.max_context_tokens:
        errors.append("slo: promptTokens + outputTokens must not exceed maxContextTokens")
    if auto.min_replicas > auto.max_replicas:
        errors.append("autoscaling: minReplicas must not exceed maxReplicas")
    if auto.idle_seconds is not None and auto.min_replicas != 0:
        errors.append("autoscaling: idleSeconds applies only with minReplicas 0")
    if sp.method == "draft" and sp.draft_model is None:
        errors.append("speculation: draftModel is required when method is draft")
    if sp.prompt_lookup_min > sp.prompt_lookup_max:
        errors.append("speculation: promptLookupMin must not exceed promptLookupMax")
    if spec.model.source.startswith("builtin:") and spec.model.source != "builtin:smollm2-135m":
        errors.append("model.source: the only builtin model is builtin:smollm2-135m")
    if spec.model.dtype == "fp8" and spec.runtime.engine != "vllm":
        errors.append(FP8_RULE)
    return errors + adapter_errors(spec)


ADAPTERS_VLLM_RULE = ("adapters and lora need runtime.engine specfleet (the operator loads adapters through its "
                      "admin API)")


def adapter_errors(spec: InferenceServiceSpec) -> list[str]:
    """The adapters' CEL rules, in Python: unique names, none the base model's, ranks within maxLoraRank,
    maxCpuLoras not below maxLoras, the specfleet runtime."""
    errors, limits = [], spec.lora_limits
    if limits is None:
        return errors
    names = [a.name for a in spec.adapters]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        errors.append(f"spec.adapters: duplicate name(s) {', '.join(duplicates)}")
    if spec.model.name in names:
        errors.append(f"spec.adapters: {spec.model.name!r} is the base model's name")
    errors += [f"spec.adapters[{a.name}].rank: {a.rank} exceeds lora.maxLoraRank {limits.max_lora_rank}"
               for a in spec.adapters if a.rank is not None and a.rank > limits.max_lora_rank]
    if limits.max_cpu_loras is not None and limits.max_cpu_loras < limits.max_loras:
        errors.append("spec.lora: maxCpuLoras must not be below maxLoras")
    if spec.runtime.engine != "specfleet":
        errors.append(ADAPTERS_VLLM_RULE)
    return errors


def _adapter_source_ok(source: str) -> bool:
    """The CRD's pattern, plus no `..` segment (a relative folder stays on the model volume)."""
    return bool(ADAPTER_SOURCE_RE.match(source)) and ".." not in source.split("://", 1)[-1].split("/")


class _Reader:
    """Reads and type-checks one CR spec, collecting errors instead of stopping at the first."""

    def __init__(self, errors: list[str]):
        self.errors = errors

    def spec(self, raw: Mapping[str, Any]) -> InferenceServiceSpec | None:
        model = self.model(self.obj(raw, "model", "spec.model", required=True), "spec.model")
        slo = self.slo(self.obj(raw, "slo", "spec.slo", required=True))
        runtime = self.runtime(self.obj(raw, "runtime", "spec.runtime"))
        accelerator = self.accelerator(self.obj(raw, "accelerator", "spec.accelerator"))
        speculation = self.speculation(self.obj(raw, "speculation", "spec.speculation"))
        autoscaling = self.autoscaling(self.obj(raw, "autoscaling", "spec.autoscaling"))
        replicas = self.int(raw, "replicas", "spec.replicas", None, lo=0)
        mode = self.enum(raw, "mode", "spec.mode", "Serving", MODES)
        adapters = self.adapters(raw.get("adapters"))
        lora = self.lora(self.obj(raw, "lora", "spec.lora"))
        if None in (model, slo) or self.errors:
            return None
        return InferenceServiceSpec(model, slo, runtime, accelerator, speculation, autoscaling, replicas, mode,
                                    adapters, lora)

    def adapters(self, raw: Any) -> tuple[Adapter, ...]:
        if raw is None:
            return ()
        if not isinstance(raw, list) or len(raw) > MAX_ADAPTERS:
            self.errors.append(f"spec.adapters: must be a list of at most {MAX_ADAPTERS} objects")
            return ()
        out = []
        for i, item in enumerate(raw):
            where = f"spec.adapters[{i}]"
            if not isinstance(item, Mapping):
                self.errors.append(f"{where}: must be an object")
                continue
            name = self.str(item, "name", f"{where}.name", None, pattern=ADAPTER_NAME_RE.pattern)
            if name is not None and len(name) > 63:
                self.errors.append(f"{where}.name: longer than 63 characters")
            source = self.str(item, "source", f"{where}.source", None)
            if source is not None and not _adapter_source_ok(source):
                self.errors.append(f"{where}.source: {source!r} is not a folder on the model volume (a relative "
                                   "path), pvc://claim/path, oci://... or https://...")
            rank = self.int(item, "rank", f"{where}.rank", None, lo=1, hi=MAX_LORA_RANK)
            if name is not None and source is not None:
                out.append(Adapter(name, source, rank))
        return tuple(out)

    def lora(self, raw: Mapping[str, Any] | None) -> LoRA | None:
        if raw is None:
            return None
        w = "spec.lora"
        slots = self.int(raw, "maxLoras", f"{w}.maxLoras", 4, lo=1, hi=64)
        rank = self.int(raw, "maxLoraRank", f"{w}.maxLoraRank", 16, lo=1, hi=MAX_LORA_RANK)
        cpu = self.int(raw, "maxCpuLoras", f"{w}.maxCpuLoras", None, lo=1, hi=1024)
        return LoRA(slots or 4, rank or 16, cpu)

    def model(self, raw: Mapping[str, Any] | None, where: str) -> ModelRef | None:
        if raw is None:
            return None
        name = self.str(raw, "name", f"{where}.name", None, pattern=r"^[A-Za-z0-9][\w.\-/]*$")
        source = self.str(raw, "source", f"{where}.source", None)
        if source is not None and not SOURCE_RE.match(source):
            self.errors.append(f"{where}.source: {source!r} is not hf://org/name[@rev], pvc://claim/path, "
                               "hostpath:/path, image:/path or builtin:name")
        dtype = self.enum(raw, "dtype", f"{where}.dtype", "bfloat16", DTYPES)
        arch = self.architecture(self.obj(raw, "architecture", f"{where}.architecture"), where)
        if name is None or source is None:
            return None
        return ModelRef(name, source, arch, dtype)

    def architecture(self, raw: Mapping[str, Any] | None, where: str) -> Architecture | None:
        if raw is None:
            return None
        values = {py: self.int(raw, key, f"{where}.architecture.{key}", None, lo=1, required=True)
                  for key, py in ARCH_FIELDS.items()}
        return None if None in values.values() else Architecture(**values)

    def slo(self, raw: Mapping[str, Any] | None) -> Slo | None:
        if raw is None:
            return None
        w = "spec.slo"
        ttft = self.num(raw, "ttftP99Ms", f"{w}.ttftP99Ms", None, lo=1, required=True)
        itl = self.num(raw, "itlP99Ms", f"{w}.itlP99Ms", None, lo=1, required=True)
        ctx = self.int(raw, "maxContextTokens", f"{w}.maxContextTokens", 4096, lo=16, hi=1 << 20)
        prompt = self.int(raw, "promptTokens", f"{w}.promptTokens", None, lo=1)
        output = self.int(raw, "outputTokens", f"{w}.outputTokens", None, lo=1)
        rps = self.num(raw, "requestsPerSecond", f"{w}.requestsPerSecond", 1.0, lo=0)
        objective = self.num(raw, "objective", f"{w}.objective", 0.99)
        if objective is not None and not 0 < objective < 1:
            self.errors.append(f"{w}.objective: {objective:g} is outside (0, 1)")
        if None in (ttft, itl, ctx, rps, objective) or self.errors:
            return None
        prompt, output = token_defaults(ctx, prompt, output)
        return Slo(ttft, itl, ctx, prompt, output, rps, objective)

    def runtime(self, raw: Mapping[str, Any] | None) -> Runtime:
        raw = raw or {}
        engine = self.enum(raw, "engine", "spec.runtime.engine", "specfleet", ENGINES)
        image = self.str(raw, "image", "spec.runtime.image", None, required=False)
        extra = raw.get("extraArgs", [])
        if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
            self.errors.append("spec.runtime.extraArgs: must be a list of strings")
            extra = []
        return Runtime(engine or "specfleet", image, tuple(extra))

    def accelerator(self, raw: Mapping[str, Any] | None) -> Accelerator:
        raw = raw or {}
        kind = self.str(raw, "type", "spec.accelerator.type", "nvidia-h100-80gb", required=False)
        count = raw.get("count", "auto")
        if count == "auto":
            return Accelerator(kind, None)
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 64:
            self.errors.append("spec.accelerator.count: must be 'auto' or an integer in [1, 64]")
            return Accelerator(kind, None)
        return Accelerator(kind, count)

    def speculation(self, raw: Mapping[str, Any] | None) -> Speculation:
        raw, w = raw or {}, "spec.speculation"
        mode = self.enum(raw, "mode", f"{w}.mode", "auto", SPEC_MODES)
        method = self.enum(raw, "method", f"{w}.method", "ngram", SPEC_METHODS)
        draft = self.model(self.obj(raw, "draftModel", f"{w}.draftModel"), f"{w}.draftModel")
        k = self.int(raw, "maxSpeculativeTokens", f"{w}.maxSpeculativeTokens", 8, lo=1, hi=16)
        alpha = self.num(raw, "minAcceptanceRate", f"{w}.minAcceptanceRate", 0.5, lo=0, hi=1)
        low = self.int(raw, "promptLookupMin", f"{w}.promptLookupMin", 2, lo=1, hi=16)
        high = self.int(raw, "promptLookupMax", f"{w}.promptLookupMax", 4, lo=1, hi=16)
        return Speculation(mode or "auto", method or "ngram", draft, k or 8, 0.5 if alpha is None else alpha,
                           low or 2, high or 4)

    def autoscaling(self, raw: Mapping[str, Any] | None) -> Autoscaling:
        raw, w = raw or {}, "spec.autoscaling"
        lo = self.int(raw, "minReplicas", f"{w}.minReplicas", 1, lo=0)
        hi = self.int(raw, "maxReplicas", f"{w}.maxReplicas", 4, lo=1)
        up = self.int(raw, "scaleUpStabilizationSeconds", f"{w}.scaleUpStabilizationSeconds", 30, lo=0)
        down = self.int(raw, "scaleDownStabilizationSeconds", f"{w}.scaleDownStabilizationSeconds", 300, lo=0)
        idle = self.int(raw, "idleSeconds", f"{w}.idleSeconds", None, lo=1)
        return Autoscaling(*(v if v is not None else d for v, d in ((lo, 1), (hi, 4), (up, 30), (down, 300))),
                           idle_seconds=idle)

    # -- typed field readers -------------------------------------------------------------------------
    def obj(self, raw: Mapping[str, Any], key: str, where: str, required: bool = False):
        value = raw.get(key)
        if value is None:
            if required:
                self.errors.append(f"{where}: required")
            return None
        if not isinstance(value, Mapping):
            self.errors.append(f"{where}: must be an object")
            return None
        return value

    def str(self, raw, key, where, default, pattern: str | None = None, required: bool = True):
        value = raw.get(key, default)
        if value is None:
            if required:
                self.errors.append(f"{where}: required")
            return None
        if not isinstance(value, str) or not value:
            self.errors.append(f"{where}: must be a non-empty string")
            return None
        if pattern and not re.match(pattern, value):
            self.errors.append(f"{where}: {value!r} does not match {pattern}")
        return value

    def enum(self, raw, key, where, default, allowed):
        value = raw.get(key, default)
        if value not in allowed:
            self.errors.append(f"{where}: {value!r} is not one of {', '.join(allowed)}")
            return None
        return value

    def int(self, raw, key, where, default, lo=None, hi=None, required=False):
        value = raw.get(key, default)
        if value is None:
            if required:
                self.errors.append(f"{where}: required")
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.errors.append(f"{where}: must be an integer")
            return None
        return self._bounded(value, where, lo, hi)

    def num(self, raw, key, where, default, lo=None, hi=None, required=False):
        value = raw.get(key, default)
        if value is None:
            if required:
                self.errors.append(f"{where}: required")
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.errors.append(f"{where}: must be a number")
            return None
        return self._bounded(float(value), where, lo, hi)

    def _bounded(self, value, where, lo, hi):
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            self.errors.append(f"{where}: {value} is outside [{lo}, {hi if hi is not None else 'inf'}]")
            return None
        return value
