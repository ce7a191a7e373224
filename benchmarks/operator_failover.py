"""Operator fail-over: how long the fleet goes without an acting operator when the leader dies or stops.

Two real `specfleet operator run -A --leader-elect` processes against the API emulator, a Lease of 3 s
(renew deadline 2 s, retry period 0.5 s), one InferenceService with two stand-in engine pods
(tests/failover.py, the scenario tests/operator/test_leader_election.py asserts on). Each repeat runs two
streams of SLO edits with new `spec.replicas` (every edit changes the rendered Deployment; plans switch
speculation on the pods): in the first the leader gets `kill -9` before edit 3, in the second (after the
killed replica is back as a follower) SIGTERM. Per stream: takeover seconds (from the signal to the
follower holding the Lease), edits lost (the last edit missing from the Deployment or status once settled),
and duplicate actions (Deployment spec writes beyond the edits, a Deployment state revisited, a speculation
switch repeated on a pod). Prints a table and writes JSON (with command, commit, machine and date).

    .venv/bin/python benchmarks/operator_failover.py            # 5 repeats, about 2-3 minutes
"""
from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))          # tests/failover.py and tests/testkit.py: the shared scenario
import failover  # noqa: E402
from provenance import commit, machine  # noqa: E402

SIGNALS = {"kill -9": signal.SIGKILL, "SIGTERM": signal.SIGTERM}


def run(repeats: int, edits: int, kill_at: int, progress) -> dict[str, list[failover.Outcome]]:
    outcomes: dict[str, list[failover.Outcome]] = {name: [] for name in SIGNALS}
    task = progress.add_task("fail-overs", total=repeats * len(SIGNALS))
    with tempfile.TemporaryDirectory() as tmp, failover.Fleet(Path(tmp)) as fleet:
        for name in fleet.names:
            fleet.start(name)
        fleet.wait_leading()
        for _ in range(repeats):
            for label, sig in SIGNALS.items():
                outcome = fleet.edit_stream(edits=edits, kill_at=kill_at, sig=sig)
                outcomes[label].append(outcome)
                fleet.replicas[outcome.old].proc.wait(30)
                fleet.start(outcome.old)                    # back, as Kubernetes would restart it
                fleet.wait_following(outcome.old)
                progress.advance(task)
    return outcomes


def summary(outcomes: list[failover.Outcome]) -> dict:
    takeovers = [o.takeover_s for o in outcomes]
    return {"takeover_s": {"median": round(statistics.median(takeovers), 3), "min": round(min(takeovers), 3),
                           "max": round(max(takeovers), 3)},
            "edits": sum(o.edits for o in outcomes), "edits_lost": sum(o.lost for o in outcomes),
            "deployment_writes": sum(o.deployment_writes for o in outcomes),
            "duplicate_actions": sum(o.duplicates for o in outcomes),
            "lease_transitions": sum(o.transitions for o in outcomes)}


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    lease = result["lease"]
    table = Table(title=f"operator fail-over, {result['repeats']} repeats (Lease {lease['duration_s']} s, renew "
                        f"deadline {lease['renew_deadline_s']:g} s, retry {lease['retry_period_s']:g} s)")
    for header in ("leader stopped by", "takeover median s", "min", "max", "edits", "lost", "Deployment writes",
                   "duplicate actions"):
        table.add_column(header, justify="right")
    for label, s in result["summary"].items():
        t = s["takeover_s"]
        table.add_row(label, f"{t['median']:.2f}", f"{t['min']:.2f}", f"{t['max']:.2f}", str(s["edits"]),
                      str(s["edits_lost"]), str(s["deployment_writes"]), str(s["duplicate_actions"]))
    Console(width=max(120, Console().width)).print(table)


def main() -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="kill -9 + SIGTERM pairs (default 5)")
    parser.add_argument("--edits", type=int, default=8, help="edits per stream, 0.6 s apart (default 8)")
    parser.add_argument("--kill-at", type=int, default=3, help="the leader is signalled before this edit (default 3)")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks/results/operator_failover.json")
    args = parser.parse_args()
    started = time.monotonic()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as progress:
        outcomes = run(args.repeats, args.edits, args.kill_at, progress)
    result = {"command": " ".join([".venv/bin/python", "benchmarks/operator_failover.py", *sys.argv[1:]]),
              "commit": commit(), "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "repeats": args.repeats, "edits_per_stream": args.edits, "signalled_before_edit": args.kill_at,
              "lease": {"duration_s": failover.DURATION_S, "renew_deadline_s": failover.RENEW_DEADLINE_S,
                        "retry_period_s": failover.RETRY_S},
              "wall_s": round(time.monotonic() - started, 1),
              "summary": {label: summary(o) for label, o in outcomes.items()},
              "runs": {label: [asdict(x) for x in o] for label, o in outcomes.items()}}
    print_table(result)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.output.relative_to(ROOT) if args.output.is_relative_to(ROOT) else args.output}")


if __name__ == "__main__":
    main()
