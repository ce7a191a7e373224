"""Serving latency side by side: the specfleet server vs transformers `generate()` behind a naive FastAPI app.

Both servers run in this process on 127.0.0.1 and get the same workload from `specfleet bench serve`'s load
generator (streaming completions, ignore_eos, fixed output length). The naive server streams with
TextIteratorStreamer and serves one request at a time, which is what "just wrap generate()" gives you.

    python benchmarks/bench_serve_smoke.py [--model DIR|smollm2-135m] [--num-prompts 32] [--request-rate 8]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import socket
import tempfile
import threading
import time
from pathlib import Path


def naive_app(model_path: str, name: str):
    import torch
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse
    from transformers import AutoModelForCausalLM, AutoTokenizer, TextIteratorStreamer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    lock = threading.Lock()
    app = FastAPI()

    @app.post("/v1/completions")
    def completions(body: dict):
        ids = tokenizer(body["prompt"], return_tensors="pt")
        streamer = TextIteratorStreamer(tokenizer, skip_prompt=True)
        n = int(body.get("max_tokens", 16))

        def work() -> None:
            with lock, torch.inference_mode():
                model.generate(**ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, streamer=streamer,
                               pad_token_id=tokenizer.pad_token_id)

        threading.Thread(target=work, daemon=True).start()

        def events():
            for text in streamer:
                if text:
                    yield f"data: {json.dumps({'choices': [{'index': 0, 'text': text}]})}\n\n"
            usage = {"prompt_tokens": ids["input_ids"].shape[1], "completion_tokens": n}
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def specfleet_app(model_path: str, name: str):
    from specfleet.engine.config import EngineConfig
    from specfleet.engine.engine import LLMEngine
    from specfleet.engine.server.app import create_app
    from specfleet.engine.server.async_engine import AsyncEngine

    return create_app(AsyncEngine(LLMEngine(EngineConfig(model=model_path, served_model_name=name,
                                                         num_kv_blocks=1024, dtype="float32"))))


def start(app) -> tuple[str, object]:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{sock.getsockname()[1]}", server


def main() -> None:
    from specfleet.cluster.loadgen import LoadTarget, print_report, run_load, summarize, synthetic_requests

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model folder or built-in name (default: a tiny random Llama)")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--request-rate", type=float, default=8.0)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--json", default=str(Path(__file__).parent / "results" / "serve_latency.json"))
    args = parser.parse_args()
    model = args.model
    if model is None:
        from specfleet.engine.tiny_model import build_tiny_model
        model = str(build_tiny_model(tempfile.mkdtemp(prefix="tiny-"), "llama"))
    elif not Path(model).is_dir():
        from specfleet.engine.builtin import ensure_builtin
        model = str(ensure_builtin(model))
    requests = synthetic_requests(args.num_prompts, args.input_len, args.output_len, seed=0)
    results = {}
    for label, build in (("specfleet", specfleet_app), ("transformers-naive", naive_app)):
        url, server = start(build(model, "bench"))
        runs, duration = asyncio.run(run_load(LoadTarget(url, "bench"), requests, args.request_rate, None, 0))
        server.should_exit = True
        results[label] = summarize(runs, duration, {})
        print(f"\n== {label}")
        print_report(results[label])
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"config": vars(args) | {"model": model}, "results": results}, indent=2))
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
