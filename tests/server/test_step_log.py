"""`engine serve --log-steps FILE`: one JSON line per engine step, whose counts add up to the requests served."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx

from testkit import free_port, wait_server_ready


def test_the_step_log_accounts_for_every_prompt_and_output_token(tiny_llama, tmp_path):
    port, steps = free_port(), tmp_path / "steps.jsonl"
    base = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "specfleet.cli.main", "engine", "serve", "--model", tiny_llama,
                             "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
                             "--num-kv-blocks", "128", "--log-level", "warning", "--log-steps", str(steps)],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        wait_server_ready(base, proc)
        body = {"model": "tiny", "prompt": [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14]], "max_tokens": 6,
                "ignore_eos": True, "temperature": 0}
        usage = httpx.post(f"{base}/v1/completions", json=body, timeout=60).json()["usage"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
    records = [json.loads(line) for line in steps.read_text().splitlines()]
    assert usage == {**usage, "prompt_tokens": 10, "completion_tokens": 12}
    assert sum(r["num_prefill_tokens"] for r in records) == 10
    # each sequence's first token comes from the step that finishes its prompt; the rest from decode steps
    assert sum(r["num_decode_seqs"] for r in records) == 12 - 2
    assert sum(r["num_tokens"] for r in records) == 10 + 12 - 2
    assert all(r["duration_s"] > 0 and not r["speculating"] for r in records)
    assert [r["t"] for r in records] == sorted(r["t"] for r in records)
