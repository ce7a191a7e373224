"""Prometheus metrics with vLLM's names (label `model_name`), plus `specfleet:` metrics vLLM lacks.

Counters and gauges are read at scrape time from the snapshot the stepping thread takes after every
step; latency histograms and the per-step ones are observed as they happen. Counters are exposed with the
`_total` suffix (`vllm:prompt_tokens_total`), as vLLM and prometheus_client both do. With LoRA on,
`vllm:lora_requests_info` carries vLLM's labels (the adapters of running and waiting requests, max_lora)
and the time of the engine snapshot as its value; only the current label set is exported.
`specfleet:lora_adapter_info` is 1 for every adapter the server serves, busy or not (the gateway routes
adapter requests by it, from the same scrape as its queue depth). `specfleet:host_info` is 1, labelled
with the CPU the engine runs on (`host.this_host`): the operator prices a service with a CPU profile only
where its engines run on the profile's CPU.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram, Summary, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from specfleet.engine.host import this_host
from specfleet.engine.stats import StepRecord

prometheus_client.disable_created_metrics()       # no `_created` series, as vLLM

if TYPE_CHECKING:
    from specfleet.engine.server.async_engine import AsyncEngine
    from specfleet.engine.server.lora import LoRARegistry

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
               0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

# (metric name without _total, EngineStats field, help)
ENGINE_COUNTERS = (
    ("vllm:prompt_tokens", "prompt_tokens", "Number of prefill tokens processed."),
    ("vllm:generation_tokens", "generation_tokens", "Number of generation tokens processed."),
    ("vllm:num_preemptions", "preemptions", "Cumulative number of preemptions."),
    ("vllm:prefix_cache_queries", "prefix_queried_tokens", "Prefix cache queries, in tokens."),
    ("vllm:prefix_cache_hits", "prefix_hit_tokens", "Prefix cache hits, in tokens."),
    ("vllm:spec_decode_num_drafts", "spec_drafts", "Number of spec decoding drafts."),
    ("vllm:spec_decode_num_draft_tokens", "spec_draft_tokens", "Number of draft tokens."),
    ("vllm:spec_decode_num_accepted_tokens", "spec_accepted_tokens", "Number of accepted tokens."),
    ("specfleet:counterfactual_draft_tokens", "counterfactual_draft_tokens",
     "N-gram draft tokens proposed and scored while speculation is off (not used for output)."),
    ("specfleet:counterfactual_accepted_tokens", "counterfactual_accepted_tokens",
     "Counterfactual n-gram draft tokens the target model would have accepted."),
    ("specfleet:spec_decode_seq_steps", "spec_decode_seq_steps",
     "Decoding sequence-steps while speculation is on, drafted or not (draft tokens / (k x this): the draft share)."),
    ("specfleet:counterfactual_seq_steps", "counterfactual_seq_steps",
     "Decoding sequence-steps scored while speculation is off."),
    ("specfleet:ngram_proposal_seq_steps", "ngram_proposal_seq_steps",
     "Decoding sequence-steps given a fresh n-gram proposal, speculation on or off (ngram_proposed_tokens "
     "/ (depth x this): the draft share at each depth)."),
    ("specfleet:engine_steps", "steps", "Engine steps that ran the model."),
)


def batch_bucket(num_seqs: int) -> str:
    """The label of a step's batch-size bucket: the smallest power of two >= B, or '256+' beyond 256."""
    for bound in BATCH_BUCKETS:
        if num_seqs <= bound:
            return str(bound)
    return f"{BATCH_BUCKETS[-1]}+"


class ServerMetrics:
    """Every metric of one served model, in its own registry (several servers can share a process)."""

    def __init__(self, model_name: str, registry: CollectorRegistry | None = None) -> None:
        self.model_name = model_name
        self.registry = registry or CollectorRegistry()
        self.engine: AsyncEngine | None = None
        self.loras: LoRARegistry | None = None          # the served adapters (set by the app)
        r, label = self.registry, ["model_name"]
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              label, buckets=TTFT_BUCKETS, registry=r).labels(model_name)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds "
                             "(one observation per output token after the first).", label, buckets=ITL_BUCKETS,
                             registry=r).labels(model_name)
        self.queue_time = Histogram("vllm:request_queue_time_seconds", "Histogram of time spent waiting (from the "
                                    "HTTP handler to the first step that took the request) in seconds.", label,
                                    buckets=TTFT_BUCKETS, registry=r).labels(model_name)
        self.prefill_time = Histogram("vllm:request_prefill_time_seconds", "Histogram of time from the first step "
                                      "that took the request to its first token in seconds.", label,
                                      buckets=TTFT_BUCKETS, registry=r).labels(model_name)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of end-to-end request latency in "
                             "seconds.", label, buckets=E2E_BUCKETS, registry=r).labels(model_name)
        self.iteration_tokens = Histogram("vllm:iteration_tokens_total", "Histogram of tokens per engine step.",
                                          label, buckets=ITERATION_TOKEN_BUCKETS, registry=r).labels(model_name)
        self.request_success = Counter("vllm:request_success", "Count of finished requests by finish reason.",
                                       ["model_name", "finished_reason"], registry=r)
        self.slo_served = Counter("specfleet:requests_slo_served", "Requests that finished with output (not "
                                  "aborted): the denominator of SLO attainment.", label, registry=r).labels(model_name)
        self.slo_met = Counter("specfleet:requests_slo_met", "Served requests whose TTFT met --ttft-deadline-ms and "
                               "whose mean time per output token met --itl-target-ms.", label,
                               registry=r).labels(model_name)
        self.slo_targets_s: tuple[float | None, float | None] = (None, None)
        self.batch_size = Histogram("specfleet:batch_size", "Histogram of sequences per engine step.", label,
                                    buckets=BATCH_BUCKETS, registry=r).labels(model_name)
        step_labels = ["model_name", "batch_size_bucket", "speculating"]
        # A summary (count and sum), not a histogram: its readers want the mean step per bucket, and buckets
        # of 18 label sets made 432 of a pod's 635 series, in every scrape Prometheus stores.
        self.step_time = Summary("specfleet:step_duration_seconds", "Engine step time by batch-size bucket "
                                 "(the bucket's upper bound) and whether the step verified drafts.",
                                 step_labels, registry=r)
        self.step_seqs = Counter("specfleet:step_seqs", "Sequences computed, by batch-size bucket (mean batch "
                                 "in a bucket = this / the step summary's count).", step_labels, registry=r)
        self.step_tokens = Counter("specfleet:step_tokens", "Tokens computed, by batch-size bucket.", step_labels,
                                   registry=r)
        self.rejected = Counter("specfleet:requests_rejected", "Requests refused before reaching the engine.",
                                ["model_name", "reason"], registry=r)
        self.lora_requests = Counter("specfleet:lora_requests", "Requests accepted for each LoRA adapter.",
                                     ["model_name", "lora_name"], registry=r)
        self.registry.register(_EngineCollector(self))

    def attach(self, engine: "AsyncEngine") -> None:
        self.engine = engine
        config = engine.engine.config
        self.slo_targets_s = tuple(None if ms is None else ms / 1000.0
                                   for ms in (config.ttft_deadline_ms, config.itl_target_ms))
        engine.observer = self
        engine.engine.step_listeners.append(self.observe_step)

    # ---- hooks, called on the stepping thread ---------------------------------------------
    def observe_step(self, record: StepRecord) -> None:
        bucket = batch_bucket(record.num_seqs)
        labels = (self.model_name, bucket, "true" if record.speculating else "false")
        self.step_time.labels(*labels).observe(record.duration_s)
        self.step_seqs.labels(*labels).inc(record.num_seqs)
        self.step_tokens.labels(*labels).inc(record.num_tokens)
        self.batch_size.observe(record.num_seqs)
        self.iteration_tokens.observe(record.num_tokens)

    def first_token(self, ttft_s: float) -> None:
        self.ttft.observe(ttft_s)

    def queued(self, queue_s: float, prefill_s: float) -> None:
        self.queue_time.observe(max(queue_s, 0.0))
        self.prefill_time.observe(max(prefill_s, 0.0))

    def inter_token(self, itl_s: float, count: int) -> None:
        for _ in range(count):
            self.itl.observe(itl_s)

    def finished(self, finish_reason: str | None, e2e_s: float) -> None:
        self.request_success.labels(self.model_name, finish_reason or "unknown").inc()
        if finish_reason != "abort":
            self.e2e.observe(e2e_s)

    def served(self, ttft_s: float, tpot_s: float) -> None:
        ttft_target, itl_target = self.slo_targets_s
        self.slo_served.inc()
        if (ttft_target is None or ttft_s <= ttft_target) and (itl_target is None or tpot_s <= itl_target):
            self.slo_met.inc()

    def lora_request(self, lora_name: str) -> None:
        self.lora_requests.labels(self.model_name, lora_name).inc()

    def reject(self, reason: str) -> None:
        self.rejected.labels(self.model_name, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector:
    """Reads the engine snapshot and the speculation switch at scrape time."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics

    def collect(self):
        name = self.metrics.model_name
        engine = self.metrics.engine
        snap = engine.snapshot if engine is not None else None
        stats = snap.stats if snap is not None else {}
        yield _gauge("vllm:num_requests_running", "Number of requests in model execution batches.", name,
                     snap.num_running if snap else 0)
        yield _gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", name,
                     snap.num_waiting if snap else 0)
        yield _gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", name,
                     snap.kv_cache_usage if snap else 0.0)
        for metric, field, help_text in ENGINE_COUNTERS:
            family = CounterMetricFamily(metric, help_text, labels=["model_name"])
            family.add_metric([name], stats.get(field, 0))
            yield family
        per_pos = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                      "Accepted tokens per draft position.", labels=["model_name", "position"])
        for position, count in enumerate(stats.get("spec_accepted_by_position", [])):
            per_pos.add_metric([name, str(position)], count)
        yield per_pos
        proposed = CounterMetricFamily("specfleet:ngram_proposed_tokens", "N-gram proposal tokens at each depth: "
                                       "the sum of min(proposal length, depth) over proposal sequence-steps.",
                                       labels=["model_name", "depth"])
        for depth, count in enumerate(stats.get("ngram_proposed_by_depth", []), start=1):
            proposed.add_metric([name, str(depth)], count)
        yield proposed
        yield from self._speculation(name, engine)
        host = GaugeMetricFamily("specfleet:host_info", "1, labelled with the CPU this engine runs on (vendor, "
                                 "family/model, vector ISA): a CPU profile prices only engines on its own.",
                                 labels=["model_name", "host"])
        host.add_metric([name, this_host()], 1.0)
        yield host
        if engine is not None and engine.engine.config.enable_lora:
            yield _lora_info(snap, engine.engine.config.max_loras)
            yield _lora_adapters(name, self.metrics.loras)

    @staticmethod
    def _speculation(name: str, engine):
        state = engine.engine.get_speculation() if engine is not None else {}
        yield _gauge("specfleet:speculation_configured", "1 if a speculative method was set up at start-up.",
                     name, float(bool(state.get("configured"))))
        yield _gauge("specfleet:speculation_enabled", "1 while speculative decoding is on.", name,
                     float(bool(state.get("enabled"))))
        yield _gauge("specfleet:num_speculative_tokens", "Current speculation depth k.", name,
                     float(state.get("num_speculative_tokens") or 0))
        yield _gauge("specfleet:max_speculative_tokens", "Largest k settable without a restart.", name,
                     float(state.get("max_speculative_tokens") or 0))


def _lora_info(snap, max_loras: int) -> GaugeMetricFamily:
    """vLLM's info gauge: adapters in its labels (comma-separated names), the snapshot's time as its value."""
    family = GaugeMetricFamily("vllm:lora_requests_info", "Running stats on lora requests.",
                               labels=["max_lora", "waiting_lora_adapters", "running_lora_adapters"])
    family.add_metric([str(max_loras), ",".join(snap.waiting_loras), ",".join(snap.running_loras)], snap.taken_at)
    return family


def _lora_adapters(model_name: str, loras: "LoRARegistry | None") -> GaugeMetricFamily:
    family = GaugeMetricFamily("specfleet:lora_adapter_info", "1 for each LoRA adapter the server serves, with "
                               "its parent model.", labels=["model_name", "lora_name", "parent"])
    for lora_name, served in sorted((loras.adapters if loras else {}).items()):
        family.add_metric([model_name, lora_name, served.parent], 1.0)
    return family


def _gauge(metric: str, help_text: str, model_name: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(metric, help_text, labels=["model_name"])
    family.add_metric([model_name], value)
    return family
