"""Shared fixtures: tiny random-weight models in the real Hugging Face layout, and stand-in engine pods
(HTTP `/metrics` in the engine's exposition, `/admin/speculation`) for control-loop tests without engines."""
from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session", autouse=True)
def _single_thread_torch():
    # Tiny models run faster on one thread, and two test workers must not fight over two cores.
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(1)
    # Build the CPU attention kernel once, up front, so engine subprocesses started by tests only load it.
    from specfleet.engine.cpu import attention

    attention.load_kernel()


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory):
    """Build (once per session and configuration) a random-weight model folder."""
    from specfleet.engine.tiny_model import build_tiny_model

    built: dict[tuple, str] = {}

    def make(arch: str = "llama", **kwargs) -> str:
        key = (arch, repr(sorted(kwargs.items())))
        if key not in built:
            built[key] = str(build_tiny_model(tmp_path_factory.mktemp(f"tiny-{arch}"), arch, **kwargs))
        return built[key]

    return make


@pytest.fixture(scope="session")
def tiny_llama(tiny_model_factory) -> str:
    return tiny_model_factory("llama")


# -- stand-in engine pods for the control loop --------------------------------------------------------
TTFT_LE = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0)
ITL_LE = (0.05, 0.1, 0.2, 0.5, 1.0)


class FakeEngine:
    """Cumulative engine metrics advancing at set rates; records admin calls. `alpha` is the per-token
    acceptance probability of a geometric draft process, so the accepted share of drafted tokens follows
    the depth k the operator sets, as a real engine's does."""

    def __init__(self):
        self.lock = threading.Lock()
        self.t = time.monotonic()
        self.rps, self.ttft, self.itl, self.batch, self.waiting = 0.5, 0.3, 0.05, 2.0, 0.0
        self.alpha, self.enabled, self.k = 0.86, True, 4
        self.report_ended = False         # export vllm:request_success_total (requests ended at `rps`)
        self.c = {"first": 0.0, "ttft_sum": 0.0, "ttft": [0.0] * len(TTFT_LE), "itl": [0.0] * len(ITL_LE),
                  "tokens": 0.0, "steps": 0.0, "seqs": 0.0, "drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0,
                  "cf_draft": 0.0, "cf_accepted": 0.0}
        self.admin_calls: list[tuple[dict, str]] = []

    def set(self, **kw):
        with self.lock:
            self._advance()
            for k, v in kw.items():
                setattr(self, k, v)

    def _advance(self):
        now = time.monotonic()
        dt, self.t = now - self.t, now
        c, n = self.c, self.rps * dt
        c["first"] += n
        c["ended"] = c.get("ended", 0.0) + n
        c["ttft_sum"] += n * self.ttft
        for i, le in enumerate(TTFT_LE):
            c["ttft"][i] += n if self.ttft <= le else 0
        for i, le in enumerate(ITL_LE):
            c["itl"][i] += n * 50 if self.itl <= le else 0
        c["tokens"] += n * 50
        steps = dt / 0.05
        c["steps"] += steps
        c["seqs"] += steps * self.batch
        drafted = steps * self.batch * self.k
        key = ("draft_tokens", "accepted") if self.enabled else ("cf_draft", "cf_accepted")
        c[key[0]] += drafted
        c[key[1]] += drafted * accepted_share(self.alpha, self.k)
        if self.enabled:
            c["drafts"] += steps * self.batch

    def exposition(self) -> str:
        with self.lock:
            self._advance()
            c, m = self.c, '{model_name="chat"}'
            lines = [f"vllm:num_requests_running{m} {self.batch}", f"vllm:num_requests_waiting{m} {self.waiting}",
                     f"vllm:kv_cache_usage_perc{m} 0.2", "# TYPE vllm:generation_tokens_total counter",
                     f"vllm:generation_tokens_total{m} {c['tokens']}",
                     "# TYPE vllm:spec_decode_num_drafts_total counter",
                     f"vllm:spec_decode_num_drafts_total{m} {c['drafts']}",
                     "# TYPE vllm:spec_decode_num_draft_tokens_total counter",
                     f"vllm:spec_decode_num_draft_tokens_total{m} {c['draft_tokens']}",
                     "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
                     f"vllm:spec_decode_num_accepted_tokens_total{m} {c['accepted']}",
                     "# TYPE specfleet:counterfactual_draft_tokens_total counter",
                     f"specfleet:counterfactual_draft_tokens_total{m} {c['cf_draft']}",
                     "# TYPE specfleet:counterfactual_accepted_tokens_total counter",
                     f"specfleet:counterfactual_accepted_tokens_total{m} {c['cf_accepted']}",
                     f"specfleet:speculation_enabled{m} {float(self.enabled)}",
                     f"specfleet:num_speculative_tokens{m} {self.k}"]
            if self.report_ended:
                lines += ["# TYPE vllm:request_success_total counter",
                          f'vllm:request_success_total{{finished_reason="stop",model_name="chat"}} {c["ended"]}']
            lines += _histogram("vllm:time_to_first_token_seconds", TTFT_LE, c["ttft"], c["first"], c["ttft_sum"])
            lines += _histogram("vllm:inter_token_latency_seconds", ITL_LE, c["itl"], c["first"] * 50,
                                c["first"] * 50 * self.itl)
            lines += _histogram("specfleet:batch_size", (), [], c["steps"], c["seqs"])
            return "\n".join(lines) + "\n"


def accepted_share(alpha: float, k: int) -> float:
    """Accepted share of k drafted tokens when each is accepted with probability alpha until the first miss."""
    return 1.0 if alpha >= 1 else alpha * (1 - alpha ** k) / ((1 - alpha) * k)


def _histogram(name, bounds, counts, total, total_sum) -> list[str]:
    out = [f"# TYPE {name} histogram"]
    out += [f'{name}_bucket{{le="{le}",model_name="chat"}} {n}' for le, n in zip(bounds, counts)]
    out += [f'{name}_bucket{{le="+Inf",model_name="chat"}} {total}', f'{name}_sum{{model_name="chat"}} {total_sum}',
            f'{name}_count{{model_name="chat"}} {total}']
    return out


def serve(engine: FakeEngine) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            body = engine.exposition().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            data = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            engine.admin_calls.append((data, self.headers.get("Authorization", "")))
            engine.set(enabled=data["enabled"], k=data["num_speculative_tokens"])
            body = json.dumps({"enabled": data["enabled"]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def fake_engine_pods():
    """`make(n) -> ([FakeEngine], {"pod-i": url})`: n stand-in pods on 127.0.0.1, shut down with the module."""
    servers: list[ThreadingHTTPServer] = []

    def make(n: int = 2):
        engines = [FakeEngine() for _ in range(n)]
        started = [serve(e) for e in engines]
        servers.extend(started)
        return engines, {f"pod-{i}": f"http://127.0.0.1:{s.server_address[1]}" for i, s in enumerate(started)}

    yield make
    for server in servers:
        server.shutdown()
