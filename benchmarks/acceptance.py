"""n-gram acceptance of the closed loop's own prompts, measured apart from it: an input of the simulator.

benchmarks/closed_loop.py sends benchmarks/speculation.py's copy-heavy and open-ended tasks as chat
completions (temperature 0, `ignore_eos`, the trace's max_tokens) to an engine that runs the manifest's n-gram
speculation. The simulator (`benchmarks/sim_to_real.py`) needs each workload's acceptance: the engine profile
records one, but measured on the profiler's own short prompts (`specfleet.engine.profiler.BUILTIN_PROMPTS`),
which copy more than these tasks do. This runs the same tasks, in the same chat template, on one in-process
engine with the manifest's speculation method and the engine's default n-gram settings, and records at each
depth 1 .. maxSpeculativeTokens what `specfleet engine profile` records for its prompts
(`profiler.measure_acceptance`: drafted and accepted tokens, drafts, decoding sequence-steps). Greedy text
is the same whatever the machine's speed, so a repeat checks that, not a spread; the run takes about a minute.

    .venv/bin/python benchmarks/acceptance.py          # writes benchmarks/results/acceptance_closed_loop.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from closed_loop import EXAMPLE                  # benchmarks/closed_loop.py: the service it runs
from provenance import stamp                     # benchmarks/provenance.py: command, commit, machine, date
from speculation import COPY_TASKS, OPEN_TASKS, chat

from specfleet.sim.trace import SIM_TO_REAL       # the closed loop's trace

OUT = Path(__file__).parent / "results" / "acceptance_closed_loop.json"


def speculation_spec(manifest: Path = EXAMPLE) -> dict:
    return yaml.safe_load(manifest.read_text())["spec"]["speculation"]


def measure(repeats: int, max_tokens: int, threads: int) -> list[list[dict]]:
    """Per repeat, the acceptance entries (as a profile's `acceptance`), each repeat on a fresh engine."""
    import torch

    from specfleet.engine import LLM
    from specfleet.engine.builtin import ensure_builtin
    from specfleet.engine.profile_format import acceptance_to_json
    from specfleet.engine.profiler import measure_acceptance

    torch.set_num_threads(threads)
    spec = speculation_spec()
    k_max = int(spec["maxSpeculativeTokens"])
    runs = []
    for _ in range(repeats):
        llm = LLM(str(ensure_builtin("smollm2-135m")), speculative_method=spec["method"],
                  num_speculative_tokens=k_max, num_kv_blocks=4096, max_num_seqs=len(COPY_TASKS) + len(OPEN_TASKS))
        prompts = {"copy-heavy": [chat(llm.tokenizer, t) for t in COPY_TASKS],
                   "open-ended": [chat(llm.tokenizer, t) for t in OPEN_TASKS]}
        runs.append(acceptance_to_json(measure_acceptance(llm.engine, prompts, k_max, max_tokens)))
        del llm
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2, help="fresh engines; greedy text should give the same counts")
    ap.add_argument("--max-tokens", type=int, default=SIM_TO_REAL.max_tokens)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    runs = measure(args.repeats, args.max_tokens, args.threads)
    for a in runs[0]:
        print(f"{a['workload']:10} k={a['k']}  acceptance {a['rate']:.3f}  draft share {a['draft_share']:.3f}")
    same = all(r == runs[0] for r in runs)
    print("repeats " + ("agree" if same else "DIFFER: " + json.dumps(runs)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**stamp("benchmarks/acceptance.py", sys.argv[1:]), "max_tokens": args.max_tokens,
                                    "speculation": speculation_spec(), "repeats_agree": same,
                                    "acceptance": runs[0], "per_repeat": runs}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
