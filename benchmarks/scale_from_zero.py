"""Scale to zero and back under `specfleet up`, with a real engine and the `openai` client.

Starts `specfleet up` (control interval 2 s) with manifests/examples/smollm2-cpu-scale-to-zero.yaml,
its `idleSeconds` lowered to `--idle`; waits until the operator has taken the service to 0 replicas
and its pod is gone; then sends `--requests` concurrent streaming chat completions through the gateway,
which holds them until the operator (woken by the held-requests annotation) has a replica ready. Reports
requests sent, succeeded, failed, cut (a stream that ended without a finish_reason), each request's time
to first token, and the operator's `status.coldStart`; writes them to `--json`.

    .venv/bin/python benchmarks/scale_from_zero.py --requests 8
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import stamp  # noqa: E402  (benchmarks/provenance.py)

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
EXAMPLE = ROOT / "manifests/examples/smollm2-cpu-scale-to-zero.yaml"


def wait(probe, timeout: float, what: str) -> None:
    print(f"waiting for {what} (at most {timeout:.0f} s)", flush=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if probe():
                return
        except (OSError, ValueError, KeyError, subprocess.SubprocessError):
            pass
        time.sleep(0.5)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


def stream_one(client, model: str, i: int, out: list) -> None:
    start, first, finish = time.monotonic(), None, None
    try:
        stream = client.chat.completions.create(model=model, stream=True, max_tokens=16,
                                                messages=[{"role": "user", "content": f"count to {i + 3}"}])
        for chunk in stream:
            choice = chunk.choices[0] if chunk.choices else None
            if choice is not None and first is None and choice.delta.content:
                first = time.monotonic() - start
            if choice is not None and choice.finish_reason:
                finish = choice.finish_reason
        out.append({"outcome": "ok" if finish else "cut", "ttft_s": first, "total_s": time.monotonic() - start})
    except Exception as exc:  # noqa: BLE001  (any failure is the figure)
        out.append({"outcome": "failed", "error": repr(exc)[:200], "total_s": time.monotonic() - start})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--idle", type=int, default=10, help="idleSeconds for the run")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/scale_from_zero.json")
    args = parser.parse_args()
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["autoscaling"]["idleSeconds"] = args.idle
    name, ns, model = doc["metadata"]["name"], doc["metadata"]["namespace"], doc["spec"]["model"]["name"]
    with tempfile.TemporaryDirectory() as tmp:
        manifest, state = Path(tmp) / "svc.yaml", Path(tmp) / "state"
        manifest.write_text(yaml.safe_dump(doc))
        log = Path(tmp) / "up.log"
        env = {**os.environ, "SPECFLEET_CONTROL_INTERVAL": "2", "SPECFLEET_DETECT_INTERVAL": "0"}
        up = subprocess.Popen([str(BIN / "specfleet"), "up", "-f", str(manifest), "--port", str(args.port), "--plain",
                               "--state-dir", str(state)], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                              start_new_session=True)
        kenv = {**os.environ, "KUBECONFIG": str(state / "kubeconfig")}

        def get(*what: str) -> dict:
            return json.loads(subprocess.run([str(BIN / "kubectl"), "get", *what, "-n", ns, "-o", "json"], env=kenv,
                                             capture_output=True, text=True, timeout=30, check=True).stdout)
        try:
            wait(lambda: "ready: model" in log.read_text(), 300, "the fleet")
            wait(lambda: get("deploy", name)["spec"]["replicas"] == 0 and not get("pods")["items"],
                 60 + 3 * args.idle, "scale to zero")
            from openai import OpenAI

            client = OpenAI(base_url=f"http://127.0.0.1:{args.port}/v1", api_key="none", timeout=300, max_retries=0)
            results: list[dict] = []
            threads = [threading.Thread(target=stream_one, args=(client, model, i, results))
                       for i in range(args.requests)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            status = get("infsvc", name)["status"]
        finally:
            os.killpg(up.pid, signal.SIGINT)
            try:
                up.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)
    counts = {k: sum(r["outcome"] == k for r in results) for k in ("ok", "failed", "cut")}
    ttfts = sorted(r["ttft_s"] for r in results if r.get("ttft_s") is not None)
    print(f"sent {args.requests}, succeeded {counts['ok']}, failed {counts['failed']}, cut {counts['cut']}")
    if ttfts:
        print(f"time to first token: min {ttfts[0]:.2f} s, max {ttfts[-1]:.2f} s")
    print(f"status.coldStart: {status.get('coldStart')}")
    decisions = [f"{d['from']} -> {d['to']} ({d['reason']})"
                 for d in status.get("lastDecisions", []) if d["kind"] == "scale"]
    print("decisions: " + ", ".join(decisions))
    args.json.write_text(json.dumps({**stamp("benchmarks/scale_from_zero.py", sys.argv[1:]), "idle_seconds": args.idle,
                                     "sent": args.requests, **counts, "ttft_s": ttfts, "requests": results,
                                     "cold_start": status.get("coldStart"), "decisions": decisions}, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
