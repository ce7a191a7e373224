"""Speculative decoding on real weights (SmolLM2-135M-Instruct): speed-up vs batch size.

Workloads: copy-heavy (repeat or lightly edit code given in the prompt) and open-ended (stories,
explanations). For each batch size, the same engine runs the same requests with speculation off and
on (toggled live, alternating, in one process), and reports tokens/s, acceptance rate alpha, mean
accepted length, the speed-up, and the Leviathan et al. prediction
(1 - alpha^(k+1)) / ((1 - alpha) (k c + 1)), c being the draft's cost per token relative to the target.
Writes benchmarks/results/speculation.json (the operator's performance model can read it as priors).

It then compares, per workload, where speculation stops paying: measured (the batch where the
speed-up crosses 1, interpolated in log batch between measured batches, per repeat: median and
spread) against predicted (`cost.break_even_batch` of the step cost the operator plans with,
at the workload's measured acceptance, draft share and k): the measured profile of SmolLM2-135M on CPU from the
profile catalogue (or `--profile FILE`) and, for reference, the cpu catalogue entry's roofline.

With `--steady STEPS` each batch is held steady (a request that ends is replaced at once by the next
prompt; prefix caching off) and off/on alternate on the same running batch, STEPS timed steps each: the
steady state a serving replica and the controller see, without the tail of a fixed batch whose
sequences end at different times. Its rows also carry the measured draft share.

    python benchmarks/speculation.py [--batches 1 4 16 64] [--max-tokens 64] [--methods ngram draft] [--steady 40]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from provenance import stamp                     # benchmarks/provenance.py: command, commit, machine, date

RESULTS = Path(__file__).parent / "results"

CODE = '''def merge_sorted(a: list[int], b: list[int]) -> list[int]:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            out.append(a[i]); i += 1
        else:
            out.append(b[j]); j += 1
    return out + a[i:] + b[j:]
'''
COPY_TASKS = [
    f"Repeat the following Python code exactly, without any comment:\n\n{CODE}",
    f"Rename the function merge_sorted to merge in this code and print the whole code:\n\n{CODE}",
    "Copy this text word for word: The operator reconciles each InferenceService into a Deployment, "
    "a Service and a PodDisruptionBudget, and it sizes the KV cache from the declared latency targets.",
    f"Add type hints where missing and repeat the code:\n\n{CODE}",
]
OPEN_TASKS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain why the sky is blue to a ten-year-old.",
    "Give me five ideas for a birthday party for a friend who loves astronomy.",
    "What are the pros and cons of working from home?",
]


def chat(tokenizer, text: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)


def timed_generate(llm, prompts, params) -> tuple[float, int, dict]:
    stats = llm.engine.stats
    before = (stats.spec_draft_tokens, stats.spec_accepted_tokens, stats.spec_drafts)
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    drafted = stats.spec_draft_tokens - before[0]
    accepted = stats.spec_accepted_tokens - before[1]
    drafts = stats.spec_drafts - before[2]
    return elapsed, sum(len(o.token_ids) for o in outs), {"drafted": drafted, "accepted": accepted, "drafts": drafts}


def leviathan(alpha: float, k: int, c: float) -> float:
    if alpha >= 1.0:
        return (k + 1) / (k * c + 1)
    return (1 - alpha ** (k + 1)) / ((1 - alpha) * (k * c + 1))


def measure(llm, tasks, batch: int, k: int, max_tokens: int, c: float, repeats: int) -> dict:
    from specfleet.engine import SamplingParams

    prompts = [chat(llm.tokenizer, tasks[i % len(tasks)]) for i in range(batch)]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    off_s = on_s = 0.0
    tokens = 0
    spec = {"drafted": 0, "accepted": 0, "drafts": 0}
    speedups = []
    for _ in range(repeats):                                           # alternate off / on
        llm.set_speculation(enabled=False)
        t_off, n, _ = timed_generate(llm, prompts, params)
        off_s, tokens = off_s + t_off, tokens + n
        llm.set_speculation(enabled=True, num_speculative_tokens=k)
        t_on, _, s = timed_generate(llm, prompts, params)
        on_s += t_on
        speedups.append(t_off / t_on)
        spec = {key: spec[key] + s[key] for key in spec}
    alpha = spec["accepted"] / max(1, spec["drafted"])
    prompt_tokens = sum(len(llm.tokenizer.encode(p)) for p in prompts) / len(prompts)
    return {"batch": batch, "k": k, "tok_per_s_off": tokens / off_s, "tok_per_s_on": tokens / on_s,
            "speedup": off_s / on_s, "acceptance_rate": alpha,
            "mean_accepted_length": 1 + spec["accepted"] / max(1, spec["drafts"]),
            "predicted_speedup": leviathan(alpha, k, c), "draft_cost_ratio": c,
            "speedups": speedups, "drafted": spec["drafted"], "accepted": spec["accepted"], "generated": tokens,
            "context": prompt_tokens + max_tokens / 2}


class SteadyBatch:
    """`batch` sequences kept running: a request that ends is replaced at once by the next prompt, so every
    step runs at the batch (as a serving replica at that concurrency does, and as the controller sees it),
    without the tail of a fixed batch whose sequences end at different times. The first requests stop
    after 1/batch, 2/batch, ... of `max_tokens`, so that request ends (and the next prompts' prefills)
    are spread over the steps instead of arriving together every `max_tokens` steps."""

    def __init__(self, llm, prompts: list[str], batch: int, max_tokens: int) -> None:
        from specfleet.engine import SamplingParams

        self.engine, self.prompts, self.next = llm.engine, prompts, 0
        self.params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        for i in range(batch):
            self._add(SamplingParams(temperature=0.0, max_tokens=max(1, max_tokens * (i + 1) // batch),
                                     ignore_eos=True))

    def _add(self, params=None) -> None:
        self.engine.add_request(f"steady-{self.next}", self.prompts[self.next % len(self.prompts)],
                                params or self.params)
        self.next += 1

    def run(self, steps: int, clock: "DecodeClock | None" = None) -> None:
        for _ in range(steps):
            generated = self.engine.stats.generation_tokens
            for out in self.engine.step():
                if out.finished:
                    self._add()
            if clock is not None:
                clock.count(self.engine.stats.generation_tokens - generated)

    def close(self) -> None:
        for request_id in list(self.engine.requests):
            self.engine.abort(request_id)


class DecodeClock:
    """Tokens and seconds of the steps that computed no prompt token (decode or verify steps alone), from the
    engine's step records: what a step cost prices. At a small batch a replaced request's prefill takes a
    step of its own, several decode steps long, and how many of them fall in a short window scatters the
    window's tokens/s far more than speculation moves it."""

    def __init__(self, engine) -> None:
        self.engine, self.tokens, self.seconds, self.last = engine, 0, 0.0, None
        self.steps = self.timed = 0

    def __enter__(self) -> "DecodeClock":
        self.engine.step_listeners.append(self._record)
        return self

    def __exit__(self, *_) -> None:
        self.engine.step_listeners.remove(self._record)

    def _record(self, record) -> None:
        self.last = record

    def count(self, generated: int) -> None:
        self.steps += 1
        if self.last is not None and self.last.num_prefill_tokens == 0:
            self.tokens, self.seconds = self.tokens + generated, self.seconds + self.last.duration_s
            self.timed += 1
        self.last = None

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def measure_steady(llm, tasks, batch: int, k: int, max_tokens: int, c: float, repeats: int, steps: int) -> dict:
    """Tokens/s at a steady batch, speculation off and on alternating on the same running batch (each
    window after `steps // 2` untimed steps in its mode; the first mode alternates between repeats, after
    `max_tokens` untimed steps that let the batch's request ends spread out); drafts and decoding
    sequence-steps give the share."""
    prompts = [chat(llm.tokenizer, tasks[i % len(tasks)]) for i in range(max(batch, len(tasks)))]
    steady = SteadyBatch(llm, prompts, batch, max_tokens)
    stats = llm.engine.stats
    speedups, decode_speedups, rates = [], [], {"off": [], "on": []}
    decode_steps = {"off": [], "on": []}          # share of each window's steps without prompt tokens
    totals = dict.fromkeys(("drafted", "accepted", "drafts", "seq_steps", "generated"), 0)
    try:
        llm.set_speculation(enabled=False)
        steady.run(max_tokens)
        for repeat in range(repeats):
            window, decode = {}, {}
            for mode in (("off", "on") if repeat % 2 == 0 else ("on", "off")):
                llm.set_speculation(enabled=mode == "on", num_speculative_tokens=k)
                steady.run(steps // 2)
                before = (stats.generation_tokens, stats.spec_draft_tokens, stats.spec_accepted_tokens,
                          stats.spec_drafts, stats.spec_decode_seq_steps)
                start = time.perf_counter()
                with DecodeClock(llm.engine) as clock:
                    steady.run(steps, clock)
                window[mode] = (stats.generation_tokens - before[0]) / (time.perf_counter() - start)
                decode[mode] = clock.rate
                decode_steps[mode].append(clock.timed / max(1, clock.steps))
                if mode == "on":
                    for key, now, then in zip(("drafted", "accepted", "drafts", "seq_steps"),
                                              (stats.spec_draft_tokens, stats.spec_accepted_tokens, stats.spec_drafts,
                                               stats.spec_decode_seq_steps), before[1:]):
                        totals[key] += now - then
                    totals["generated"] += stats.generation_tokens - before[0]
                rates[mode].append(window[mode])
            speedups.append(window["on"] / window["off"])
            if decode["off"] and decode["on"]:
                decode_speedups.append(decode["on"] / decode["off"])
    finally:
        steady.close()
    alpha = totals["accepted"] / max(1, totals["drafted"])
    share = totals["drafted"] / max(1, k * totals["seq_steps"])
    return {"batch": batch, "k": k, "tok_per_s_off": statistics.median(rates["off"]),
            "tok_per_s_on": statistics.median(rates["on"]), "speedup": statistics.median(speedups),
            "acceptance_rate": alpha, "draft_share": share,
            "mean_accepted_length": 1 + totals["accepted"] / max(1, totals["drafts"]),
            "predicted_speedup": leviathan(alpha, k, c), "draft_cost_ratio": c, "speedups": speedups,
            "decode_speedups": decode_speedups,
            "decode_step_share": {mode: statistics.fmean(v) for mode, v in decode_steps.items() if v},
            "drafted": totals["drafted"], "accepted": totals["accepted"], "drafts": totals["drafts"],
            "generated": totals["generated"],
            "seq_steps": totals["seq_steps"],
            "context": statistics.fmean(len(llm.engine.encode(p)) for p in prompts) + max_tokens / 2}


def crossing(batches: list[int], speedups: list[float]) -> float:
    """The batch where the speed-up falls through 1, linear in log batch between measured batches; 0 when
    even the smallest batch does not pay, inf when the largest still does."""
    points = sorted(zip(batches, speedups))
    if points[0][1] <= 1.0:
        return 0.0
    for (b0, s0), (b1, s1) in zip(points, points[1:]):
        if s1 <= 1.0:
            share = (s0 - 1.0) / (s0 - s1)
            return math.exp(math.log(b0) + share * (math.log(b1) - math.log(b0)))
    return math.inf


TOLERANCE = 0.30        # the target: predicted break-even within 30% of the measured one


def within_target(predicted: float, measured: float, batches: list[int]) -> bool:
    """Within 30%; where the measurement only bounds it (never pays / always pays over the batches
    measured), on the same side of that bound with the same slack."""
    if measured == 0.0:
        return predicted < min(batches) * (1 + TOLERANCE)
    if math.isinf(measured):
        return predicted > max(batches) / (1 + TOLERANCE)
    return abs(predicted / measured - 1) <= TOLERANCE


def _number(x: float) -> float | str:
    return "inf" if math.isinf(x) else x


def break_even_table(rows: list[dict], costs: dict, repeats: int) -> list[dict]:
    """Per workload (ngram rows): the measured crossover (median, spread over repeats) and each cost's
    predicted break-even at the pooled measured acceptance, with the relative error."""
    from specfleet.operator.cost import alpha_from_acceptance, break_even_batch

    out = []
    for workload in ("copy-heavy", "open-ended"):
        mine = [r for r in rows if r["method"] == "ngram" and r["workload"] == workload]
        if not mine:
            continue
        k = mine[0]["k"]
        rate = sum(r["accepted"] for r in mine) / max(1, sum(r["drafted"] for r in mine))
        alpha = alpha_from_acceptance(rate, k)
        ctx = round(statistics.fmean(r["context"] for r in mine))
        batches = [r["batch"] for r in mine]
        per_repeat = [crossing(batches, [step_speedups(r)[i] for r in mine]) for i in range(repeats)]
        measured = statistics.median(per_repeat)
        row = {"workload": workload, "k": k, "acceptance_rate": rate, "alpha": alpha, "context": ctx,
               "batches": batches, "measured_break_even": _number(measured),
               "measured_per_repeat": [_number(b) for b in per_repeat],
               "measured_spread": [_number(min(per_repeat)), _number(max(per_repeat))]}
        gain, verify_q = drafting(mine, repeats)
        share = min(1.0, (verify_q - 1) / k)        # drafted tokens per k decoding sequence-steps
        row.update(tokens_per_sequence_step=gain, verify_tokens_per_sequence=verify_q, draft_share=share)
        limit = 4.0 * max(batches)
        # What the controller computes: its cost at the measured acceptance and draft share.
        predictions = {name: break_even_batch(cost, ctx, alpha, k, limit=limit, share=share)
                       for name, cost in costs.items()}
        if "profile" in costs:
            predictions["profile_drafting"] = drafting_break_even(costs["profile"], ctx, gain, verify_q, limit)
        for name, predicted in predictions.items():
            row[f"predicted_{name}"] = predicted
            finite = 0 < measured < math.inf
            row[f"error_{name}"] = predicted / measured - 1 if finite else None
            row[f"within_target_{name}"] = within_target(predicted, measured, batches)
        out.append(row)
    return out


def speedup_by_batch(rows: list[dict], costs: dict) -> list[dict]:
    """Per measured steady row: the speed-up (median and range over repeats) against each cost's price of
    what speculation did in that row (tokens per sequence-step, tokens verified per sequence), so the
    cost is judged where the break-even, a crossing of a curve near 1, is ill-conditioned."""
    out = []
    for r in rows:
        if r["method"] != "ngram" or "seq_steps" not in r:
            continue
        gain, verify_q = drafting([r], 1)
        share = drafting_share(r)
        measured = step_speedups(r)
        entry = {"workload": r["workload"], "batch": r["batch"], "measured": statistics.median(measured),
                 "measured_range": [min(measured), max(measured)], "repeats": len(measured), "drafting_share": share,
                 "served": statistics.median(r["speedups"])}
        for name, cost in costs.items():
            entry[f"predicted_{name}"] = gain * cost.step(r["batch"], r["context"], 1) / cost.step(
                r["batch"], r["context"], verify_q, share)
        out.append(entry)
    return out


def step_speedups(row: dict) -> list[float]:
    """Per repeat, the speed-up a step cost prices: of the steps without prompt tokens where the row timed
    them (`DecodeClock`), else of the whole window (rows written before they were timed apart)."""
    decode = row.get("decode_speedups")
    return decode if decode and len(decode) == len(row["speedups"]) else row["speedups"]


def drafting_share(row: dict) -> float:
    """Share of a steady row's decoding sequence-steps that verified a draft: its `drafts`; a row written
    before it was recorded gives them as accepted tokens over the mean accepted length less one, and
    without acceptances as drafted tokens per k sequence-steps."""
    if "drafts" in row:
        drafts = row["drafts"]
    elif row.get("mean_accepted_length", 1) > 1 and row.get("accepted"):
        drafts = row["accepted"] / (row["mean_accepted_length"] - 1)
    else:
        drafts = row["drafted"] / max(1, row["k"])
    return min(1.0, drafts / max(1, row["seq_steps"]))


def by_batch_summary(entries: list[dict], names: list[str]) -> dict:
    """Per cost and workload: the share of batches whose priced speed-up lies in the measured range, the share
    a flawless price would (`chance_in_range`), and the median relative error against the measured median."""
    out = {}
    for name in names:
        for workload in sorted({e["workload"] for e in entries}):
            mine = [e for e in entries if e["workload"] == workload]
            priced = [e[f"predicted_{name}"] for e in mine]
            out[f"{name}/{workload}"] = {
                "in_range": sum(lo <= p <= hi for p, (lo, hi) in zip(priced, (e["measured_range"] for e in mine)))
                / len(mine),
                "chance_in_range": statistics.fmean(chance_in_range(e.get("repeats", 0)) for e in mine),
                "median_abs_error": statistics.median(abs(p / e["measured"] - 1) for p, e in zip(priced, mine))}
    return out


def chance_in_range(repeats: int) -> float:
    """How often the true median speed-up lies between the least and the greatest of `repeats` independent
    measurements: all but when every one falls on the same side of it, 1 - 2 x 2^-repeats (0.75 for 3, 0.94
    for 5). A price without error lands in the measured range that often, so a share of batches in range
    is judged against it, not against 1. 0 where the repeats were not recorded."""
    return 1 - 2 * 0.5 ** repeats if repeats > 0 else 0.0


def drafting(rows: list[dict], repeats: int) -> tuple[float, float]:
    """What speculation did per sequence per step, measured: tokens produced, and tokens verified (1 plus
    the drafts). n-gram drafts only where the context has a match, so on open-ended text most steps draft
    nothing and the acceptance of the drafts made overstates the gain (and the cost) of a step."""
    if all("seq_steps" in r for r in rows):             # steady batches count their decoding sequence-steps
        steps = sum(r["seq_steps"] for r in rows)
        return (1 + sum(r["accepted"] for r in rows) / steps, 1 + sum(r["drafted"] for r in rows) / steps)
    generated = sum(r["generated"] for r in rows)
    first = repeats * sum(r["batch"] for r in rows)          # each request's first token came from its prefill
    steps = generated - sum(r["accepted"] for r in rows) - first
    return generated / steps, 1 + sum(r["drafted"] for r in rows) / steps


def drafting_break_even(cost, ctx: int, gain: float, verify_q: float, limit: float) -> float:
    """The batch where `gain` tokens per sequence-step stop paying for verifying `verify_q` tokens each."""
    def pays(b: float) -> bool:
        return gain * cost.step(b, ctx, 1) > cost.step(b, ctx, verify_q)

    if not pays(1.0):
        return 0.0
    if pays(limit):
        return limit
    lo, hi = 1.0, limit
    while hi - lo > 1e-3:
        lo, hi = ((lo + hi) / 2, hi) if pays((lo + hi) / 2) else (lo, (lo + hi) / 2)
    return lo


def operator_costs(profile_path: str | None) -> dict:
    """The step costs the operator would plan SmolLM2-135M on the cpu entry with: the profile, the roofline."""
    from specfleet.operator import catalogs
    from specfleet.operator.api import ModelRef
    from specfleet.operator.catalogs.profile_catalog import read_entry
    from specfleet.operator.cost import Roofline

    ref = ModelRef(name="smollm2-135m", source="builtin:smollm2-135m")     # as manifests/examples/smollm2-cpu.yaml
    costs = {"roofline": Roofline(catalogs.models().lookup(ref).with_dtype(ref.dtype),
                                  catalogs.gpus()["cpu"].calibration(1))}
    entry = read_entry(Path(profile_path)) if profile_path else catalogs.profiles().lookup(ref, "cpu")
    if entry is None or entry.cost is None:
        print(f"no usable profile ({entry.error if entry else 'none in the catalogue for smollm2-135m on cpu'})")
    else:
        costs["profile"] = entry.cost
    return costs


def fit_check(profile) -> list[dict]:
    """Per (batch, context) of a profile: a two-token verify step over a decode step, as its points measured
    and as its fits price them. `range`: the relative max - min of the ratio over the points' single timed
    steps (to first order, the sum of both points' relative spreads), how much one step varies; each point
    is the median of its repeats, which varies less."""
    points = {(p.kind, p.batch, p.context, p.q): p for p in profile.points}
    decode, verify = profile.fit["decode"], profile.fit.get("verify", profile.fit["decode"])
    pairs = [(d, points[("verify", b, c, 2)]) for (kind, b, c, q), d in sorted(points.items())
             if kind == "decode" and q == 1 and ("verify", b, c, 2) in points]
    return [{"batch": d.batch, "context": d.context, "points": v.median_s / d.median_s,
             "fit": verify.seconds(d.batch, d.context, 2) / decode.seconds(d.batch, d.context, 1),
             "range": v.spread_s / v.median_s + d.spread_s / d.median_s} for d, v in pairs]


def print_fit_check(path: str | None) -> None:
    from rich.console import Console
    from rich.table import Table

    from specfleet.engine import profile_format
    from specfleet.operator.catalogs.profile_catalog import HERE

    path = path or str(HERE / "smollm2-135m--cpu.json")                  # the shipped CPU profile
    table = Table(title=f"verify (q = 2) / decode step time: points against fit, {Path(path).name}")
    for col in ("batch", "context", "points", "fit", "fit / points", "points' range"):
        table.add_column(col, justify="right")
    for r in fit_check(profile_format.load(path)):
        table.add_row(str(r["batch"]), str(r["context"]), f"{r['points']:.2f}", f"{r['fit']:.2f}",
                      f"{r['fit'] / r['points']:.2f}", f"{100 * r['range']:.0f}%")
    Console().print(table)


def draft_cost_ratio(target_layers: int, draft_layers: int) -> float:
    return draft_layers / target_layers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--methods", nargs="+", default=["ngram", "draft"])
    parser.add_argument("--draft-layers", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--steady", type=int, default=0, metavar="STEPS",
                        help="measure at a steady batch (ended requests replaced at once), STEPS timed engine steps "
                             "per mode and repeat, instead of generating one fixed batch to the end")
    parser.add_argument("--ngram-min", type=int, default=2,
                        help="shortest suffix the n-gram proposer matches (the engine's default 2; 1 drafts more "
                             "often and has more drafts rejected)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads; 1 avoids OpenMP stalls when other processes share the cores "
                             "(match the profile's threads when comparing break-evens)")
    parser.add_argument("--profile", default=None,
                        help="profile JSON to predict break-evens with (default: the catalogue's smollm2-135m--cpu)")
    parser.add_argument("--json", type=Path, default=RESULTS / "speculation.json", help="where to write the results")
    parser.add_argument("--predict-from", type=Path, default=None, metavar="JSON",
                        help="measure nothing: predict the break-evens of an earlier run's results again, with "
                             "today's costs (after a profile refit), and write them to --json")
    parser.add_argument("--fit-check", action="store_true",
                        help="measure nothing: print the profile's verify/decode step ratios, points against fit")
    args = parser.parse_args()
    if args.fit_check:
        return print_fit_check(args.profile)
    if args.predict_from:
        return predict_again(args)
    import torch
    torch.set_num_threads(args.threads)

    from rich.console import Console
    from rich.table import Table

    from specfleet.engine import LLM
    from specfleet.engine.builtin import cache_dir, ensure_builtin
    from specfleet.engine.speculative.draft import make_truncated_draft

    console = Console()
    target = ensure_builtin("smollm2-135m")
    draft_dir = cache_dir() / f"smollm2-135m-first{args.draft_layers}"
    if "draft" in args.methods and not (draft_dir / "config.json").exists():
        make_truncated_draft(target, draft_dir, args.draft_layers)
    rows = []
    for method in args.methods:
        extra = {"draft_model": str(draft_dir)} if method == "draft" else {}
        llm = LLM(str(target), speculative_method=method, num_speculative_tokens=args.k, num_kv_blocks=4096,
                  max_num_seqs=max(args.batches), enable_prefix_caching=not args.steady, ngram_min=args.ngram_min,
                  **extra)
        c = draft_cost_ratio(30, args.draft_layers) if method == "draft" else 0.0
        for workload, tasks in (("copy-heavy", COPY_TASKS), ("open-ended", OPEN_TASKS)):
            for batch in args.batches:
                with console.status(f"{method} {workload} batch {batch}"):
                    r = (measure_steady(llm, tasks, batch, args.k, args.max_tokens, c, args.repeats, args.steady)
                         if args.steady else measure(llm, tasks, batch, args.k, args.max_tokens, c, args.repeats))
                rows.append({"method": method, "workload": workload, **r})
                console.print(f"{method:5} {workload:10} B={batch:<3} off {r['tok_per_s_off']:7.1f} tok/s  "
                              f"on {r['tok_per_s_on']:7.1f} tok/s  x{r['speedup']:.2f}  "
                              f"alpha {r['acceptance_rate']:.2f}  predicted x{r['predicted_speedup']:.2f}")
        del llm
    table = Table(title=f"Speculative decoding, SmolLM2-135M fp32 on CPU, k={args.k}, {args.max_tokens} tokens/request")
    for col in ("method", "workload", "batch", "off tok/s", "on tok/s", "speed-up", "alpha", "mean accepted",
                "predicted", "measured/predicted"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["method"], r["workload"], str(r["batch"]), f"{r['tok_per_s_off']:.1f}",
                      f"{r['tok_per_s_on']:.1f}", f"{r['speedup']:.2f}x", f"{r['acceptance_rate']:.2f}",
                      f"{r['mean_accepted_length']:.2f}", f"{r['predicted_speedup']:.2f}x",
                      f"{r['speedup'] / r['predicted_speedup']:.0%}")
    console.print(table)
    stops = {f"{m}/{w}": next((r["batch"] for r in rows if r["method"] == m and r["workload"] == w
                               and r["speedup"] < 1.0), None)
             for m in args.methods for w in ("copy-heavy", "open-ended")}
    console.print(f"batch size where speculation stops paying: {stops}")
    predictions = predict(rows, operator_costs(args.profile), args)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({**stamp("benchmarks/speculation.py", sys.argv[1:]),
                                     "args": {**vars(args), "json": str(args.json)}, "rows": rows,
                                     "stops_paying_at_batch": stops, **predictions}, indent=2))


def predict(rows: list[dict], costs: dict, args) -> dict:
    """The break-even table and the speed-up by batch of measured rows, priced by `costs`; printed."""
    from rich.console import Console

    break_even = break_even_table(rows, costs, args.repeats)
    by_batch = speedup_by_batch(rows, costs)
    names = [key.removeprefix("predicted_") for key in (break_even[0] if break_even else {}) if key.startswith("predicted_")]
    console = Console(width=max(Console().width, 170))
    console.print(_break_even_rich(break_even, names, args))
    if by_batch:
        console.print(_by_batch_rich(by_batch, list(costs), args))
    return {"break_even": break_even, "speedup_by_batch": by_batch,
            "speedup_by_batch_summary": by_batch_summary(by_batch, list(costs))}


def predict_again(args) -> None:
    earlier = json.loads(args.predict_from.read_text())
    ran = argparse.Namespace(**earlier["args"])
    predictions = predict(earlier["rows"], operator_costs(args.profile), ran)
    again = {"from": str(args.predict_from), "profile": args.profile,
             **stamp("benchmarks/speculation.py", sys.argv[1:])}
    args.json.write_text(json.dumps({**earlier, **predictions, "predicted_again": again}, indent=2))


def _break_even_rich(table_rows: list[dict], names: list[str], args):
    from rich.table import Table

    table = Table(title=f"Break-even batch, ngram k={args.k}: measured vs predicted by the operator's step cost "
                        f"({args.repeats} repeats; target: within 30%)")
    for col in ["workload", "acceptance", "alpha", "context", "measured (median)", "spread"] + \
            [f"{n} predicted" for n in names] + [f"{n} error" for n in names]:
        table.add_column(col, justify="right")
    for r in table_rows:
        spread = "{}-{}".format(*(_shown(b, r["batches"]) for b in r["measured_spread"]))
        table.add_row(r["workload"], f"{r['acceptance_rate']:.2f}", f"{r['alpha']:.2f}", str(r["context"]),
                      _shown(r["measured_break_even"], r["batches"]), spread,
                      *[f"{r[f'predicted_{n}']:.1f}" for n in names],
                      *[("-" if r[f"error_{n}"] is None else f"{r[f'error_{n}']:+.0%}")
                        + (" ok" if r[f"within_target_{n}"] else " miss") for n in names])
    return table


def _by_batch_rich(entries: list[dict], names: list[str], args):
    from rich.table import Table

    table = Table(title=f"Speed-up by batch, ngram k={args.k}: measured (median, range over {args.repeats} repeats) "
                        "against each cost's price of what speculation did")
    for col in ["workload", "batch", "measured", "range"] + [f"{n}" for n in names]:
        table.add_column(col, justify="right")
    for e in entries:
        lo, hi = e["measured_range"]
        table.add_row(e["workload"], str(e["batch"]), f"{e['measured']:.2f}", f"{lo:.2f}-{hi:.2f}",
                      *[f"{e[f'predicted_{n}']:.2f}" + (" in" if lo <= e[f"predicted_{n}"] <= hi else "")
                        for n in names])
    table.caption = "  ".join(f"{key}: {v['in_range']:.0%} in range, median error {v['median_abs_error']:.0%}"
                              for key, v in by_batch_summary(entries, names).items())
    return table


def _shown(b, batches: list[int]) -> str:
    if b == "inf":
        return f">{max(batches)}"
    return f"<{min(batches)}" if b == 0 else f"{b:.1f}"


if __name__ == "__main__":
    main()
