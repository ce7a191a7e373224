"""Printing and plotting simulation results."""
from __future__ import annotations

from pathlib import Path

KEYS = ("slo_attainment", "goodput", "gpu_hours", "scaling_actions", "speculation_switches", "mean_tpot_ms",
        "ttft_p99_ms", "max_replicas", "requests")


def print_summary(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{result['scenario']} / {result['policy']}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in KEYS:
        table.add_row(key, f"{result[key]:g}" if isinstance(result[key], (int, float)) else str(result[key]))
    Console().print(table)


def plot(result: dict, path: Path) -> None:
    """Replicas, arrival rate, TTFT/ITL p99 and speculation over time (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result["series"]
    t = [p["t"] / 60 for p in s]
    fig, (a, b, c) = plt.subplots(3, 1, sharex=True, figsize=(10, 8))
    a.plot(t, [p["replicas"] for p in s], label="replicas")
    a.plot(t, [p["ready"] for p in s], label="ready")
    a2 = a.twinx()
    a2.plot(t, [p["rate"] for p in s], color="grey", alpha=0.5, label="req/s")
    a.set_ylabel("replicas")
    a2.set_ylabel("req/s")
    a.legend(loc="upper left")
    b.plot(t, [p["ttft_p99_ms"] for p in s], label="TTFT p99 (ms)")
    b.set_yscale("log")
    b.legend(loc="upper left")
    c.plot(t, [p["itl_p99_ms"] for p in s], label="ITL p99 (ms)")
    c.step(t, [p["k"] for p in s], label="speculation k", where="post")
    c.legend(loc="upper left")
    c.set_xlabel("minutes")
    fig.suptitle(f"{result['scenario']} / {result['policy']}: attainment {result['slo_attainment']:.3f}, "
                 f"{result['gpu_hours']:.2f} GPU-h")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
