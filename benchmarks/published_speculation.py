"""Published speculative-decoding speed-ups against the operator's GPU pricing, per batch.

No engine runs here: it prices each series of tests/data/published_speculation.yaml (EAGLE-3's SGLang
and vLLM batch tables, MagicDec's long-context tables) with the operator's roofline and with its former
pricing (docs/speculation-gpu.md; both in tests/published_pricing.py), prints one table per series
(published, roofline and former speed-up at each measured batch; the break-even batches) and writes
benchmarks/results/published_speculation.json. The numbers are arithmetic, so one run is the result.

    python benchmarks/published_speculation.py
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from provenance import stamp   # benchmarks/: the script's own folder is on sys.path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))          # tests/published_pricing.py: shared with the test
from published_pricing import DATA, PRICINGS, SPEEDUP, load, priced_break_even  # noqa: E402

OUT = ROOT / "benchmarks/results/published_speculation.json"


def priced(series) -> dict:
    rows = [{"batch": b, "k": series.k_at(b), "published": p,
             **{name: round(SPEEDUP[name](series, b), 3) for name in PRICINGS}}
            for b, p in zip(series.batches, series.speedups)]
    crossing = {name: _finite(priced_break_even(series, name)) for name in PRICINGS}
    lo, hi = series.break_even
    return {"id": series.id, "source": series.source, "gpu": f"{series.gpus}x {series.gpu}", "model": series.model,
            "draft": series.draft.name, "alpha": series.alpha, "ctx": series.ctx, "rows": rows,
            "break_even": {"published": [lo, hi], **crossing},
            "agrees": {name: series.agrees[name]["value"] for name in PRICINGS}}


def _finite(x: float) -> float | str:
    return "never" if x == 0 else "beyond 4096" if math.isinf(x) else round(x, 1)


def table(result: dict) -> Table:
    be = result["break_even"]
    lo, hi = be["published"]
    t = Table(title=f"{result['id']}: {result['gpu']}, {result['model']} + {result['draft']}, "
                    f"alpha {result['alpha']}, ctx {result['ctx']}",
              caption=f"break-even: published [{lo}, {hi or '-'}], roofline {be['roofline']}, "
                      f"former {be['former']}")
    for column in ("batch", "k", "published", "roofline", "former"):
        t.add_column(column, justify="right")
    for r in result["rows"]:
        t.add_row(str(r["batch"]), str(r["k"]), f"{r['published']:.2f}", f"{r['roofline']:.2f}",
                  f"{r['former']:.2f}")
    return t


def main() -> None:
    series, _ = load()
    results = [priced(s) for s in series]
    console = Console()
    for result in results:
        console.print(table(result))
    OUT.write_text(json.dumps({**stamp("benchmarks/published_speculation.py", sys.argv[1:]),
                               "data": str(DATA.relative_to(ROOT)),
                               "note": "priced arithmetic, not a measurement: one run is the result",
                               "series": results}, indent=2) + "\n")
    console.print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
