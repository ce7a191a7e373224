"""How far the speculation threshold moves with the verify scale, on the shipped SmolLM2 CPU profile.

No engine runs here. For the service model the operator builds from `manifests/examples/smollm2-cpu.yaml`
and the shipped profile, at acceptance `--alpha` (per-token probability) and each draft share, it prints
`maxBatchForSpeculation` and the speed-up the model prices (goodput speculating at the best depth over
goodput without; below 1 it costs) at several batches, for verify scales of 1.0 (the profile as measured) and above
(verification seen to take that much longer online, `status.calibration.verifyScale`). Where the speed-up
stays near 1 over a wide range of batches, a few percent in the scale move the threshold a long way.
`--profile FILE` prices with another profile (an older one, or one measured on another host) in the shipped
one's place; `--shares` sets the draft shares (a workload's measured share at k = 1, say); `--k K` prices
speculation at depth K instead of the best depth.
Writes benchmarks/results/threshold_sensitivity.json.

    .venv/bin/python benchmarks/threshold_sensitivity.py [--alpha 0.78] [--shares 1.0 0.44] [--k 1] [--profile FILE]
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "manifests/examples/smollm2-cpu.yaml"
BATCHES = (1, 2, 4, 6, 8, 12, 16, 24, 32, 48)
SHARES = (1.0, 0.44)              # every sequence drafts; copy-heavy's measured share (docs/control.md)
VERIFY_SCALES = (1.0, 1.1, 1.3)


def service_model(profile: Path | None = None):
    from specfleet.operator import api, capacity, catalogs, planner

    spec = api.parse_spec(yaml.safe_load(EXAMPLE.read_text())["spec"])
    plan = planner.plan(spec, catalogs.gpus(), catalogs.models(), profile_catalog(profile))
    return capacity.service_model(spec, plan, catalogs.gpus(), catalogs.models())


def profile_catalog(path: Path | None):
    """The shipped profiles, or only `path` as SmolLM2's CPU profile."""
    from specfleet.engine.profile_model import load
    from specfleet.operator import catalogs
    from specfleet.operator.catalogs.profile_catalog import ProfileCatalog, ProfileEntry
    from specfleet.operator.step_cost import profile_cost

    if path is None:
        return catalogs.profiles()
    name = "smollm2-135m--cpu"
    return ProfileCatalog({("smollm2-135m", "cpu"): ProfileEntry(name, profile_cost(load(path), name))})


def speedup(model, batch: int, alpha: float, k: int) -> float:
    """The model's priced speed-up at `batch`: at the best depth (k = 0) or at depth k."""
    from specfleet.operator import perfmodel as pm

    if not k:
        return model.speedup(batch, alpha)[0]
    price = lambda depth: pm.goodput_of(model.cost, batch, model.ctx, alpha, depth, model.draft, model.draft_share)
    return price(k) / price(0)


def rows(alpha: float, shares: tuple[float, ...] = SHARES, profile: Path | None = None, k: int = 0) -> list[dict]:
    base = service_model(profile)
    out = []
    for share in shares:
        for scale in VERIFY_SCALES:
            model = replace(base, profile=replace(base.profile, verify_scale=scale)).with_draft_share(share)
            out.append({"draft_share": share, "verify_scale": scale,
                        "max_batch_for_speculation": model.max_batch_for_speculation(alpha),
                        "speedup": {b: round(speedup(model, b, alpha, k), 3) for b in BATCHES}})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--alpha", type=float, default=0.78)
    parser.add_argument("--shares", type=float, nargs="+", default=list(SHARES))
    parser.add_argument("--k", type=int, default=0, help="depth priced (0: the best, as the controller picks)")
    parser.add_argument("--profile", type=Path, default=None, help="price with this profile (default: the shipped one)")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/threshold_sensitivity.json")
    args = parser.parse_args()
    from rich.console import Console
    from rich.table import Table

    depth = f"k = {args.k}" if args.k else "the best k"
    table = Table(title=f"speculation threshold and priced speed-up at a = {args.alpha}, {depth}")
    for column in ("draft share", "verify scale", "threshold", *[f"x@{b}" for b in BATCHES]):
        table.add_column(column)
    result = rows(args.alpha, tuple(args.shares), args.profile, args.k)
    for row in result:
        table.add_row(f"{row['draft_share']:.2f}", f"{row['verify_scale']:.1f}", str(row["max_batch_for_speculation"]),
                      *[f"{row['speedup'][b]:.2f}" for b in BATCHES])
    Console(width=140).print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"alpha": args.alpha, "manifest": str(EXAMPLE.relative_to(ROOT)),
                                     "profile": str(args.profile or "shipped"), "k": args.k, "rows": result},
                                    indent=2))


if __name__ == "__main__":
    main()
