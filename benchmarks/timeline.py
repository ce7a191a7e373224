"""What the control loop did during one closed-loop run, from the fleet's Prometheus, as one picture.

`collect` runs range queries (`/api/v1/query_range` over the run, at a step of the scrape interval) for
the offered load, the replicas, the speculation state, TTFT and ITL p99 with their SLO targets and the
error budget's burn rate, and returns plain JSON (times in seconds since the trace started) that
benchmarks/closed_loop.py stores beside its figures; `render` draws that JSON as stacked panels on one
time axis, so an image can be drawn again offline from the JSON alone (`closed_loop.py --render-only`).

Engine series carry `namespace`/`inferenceservice` (the engines' PodMonitor relabels the pod label); the
operator's carry `namespace`/`name` (operator/control/telemetry.py). Batch and quantiles are over
`rate_window_s`, a few scrapes, so they follow the load closely, the request rate over twice that (a
closed loop finishes requests in bursts); the operator's own window p99
(`specfleet_observed_latency_seconds`) is drawn beside them. The operator exports no desired replicas
for a CR with fixed `spec.replicas`; the picture then draws that fixed count (`spec_replicas`).
"""
from __future__ import annotations

import json
import math
import re
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

ENGINE = 'namespace="{namespace}",inferenceservice="{name}"'
OPERATOR = 'namespace="{namespace}",name="{name}"'
QUANTILE = "histogram_quantile(0.99, sum by (le) (rate({metric}_bucket{{{engine}}}[{window}])))"

# key -> PromQL; {engine}/{operator} are the label matchers above, {window} the rate window
QUERIES = {
    "request_rate": "sum(rate(vllm:request_success_total{{{engine}}}[{long_window}]))",
    "batch": "sum(rate(specfleet:batch_size_sum{{{engine}}}[{window}]))"
             " / sum(rate(specfleet:batch_size_count{{{engine}}}[{window}]))",
    "desired_replicas": "max(specfleet_desired_replicas{{{operator}}})",
    "ready_replicas": "max(specfleet_replicas{{{operator}}})",
    "speculation_enabled": "max(specfleet_speculation_enabled{{{operator}}})",
    "speculation_k": "max(specfleet_speculation_k{{{operator}}})",
    "ttft_p99": QUANTILE.replace("{metric}", "vllm:time_to_first_token_seconds"),
    "itl_p99": QUANTILE.replace("{metric}", "vllm:inter_token_latency_seconds"),
    "ttft_p99_operator": 'max(specfleet_observed_latency_seconds{{{operator},metric="ttft"}})',
    "itl_p99_operator": 'max(specfleet_observed_latency_seconds{{{operator},metric="itl"}})',
    "ttft_slo": 'max(specfleet_slo_target_seconds{{{operator},metric="ttft"}})',
    "itl_slo": 'max(specfleet_slo_target_seconds{{{operator},metric="itl"}})',
    "burn_rate_5m": 'max(specfleet_error_budget_burn_rate{{{operator},window="5m"}})',
    "burn_rate_5m_rule": "max(specfleet:slo_burn_rate:5m{{{engine}}})",
}


@dataclass(frozen=True)
class Span:
    """Which service, over which wall-clock span, at which resolution."""

    namespace: str
    name: str
    start: float                 # epoch seconds
    end: float
    t0: float                    # epoch seconds of the trace's start: the picture's time zero
    step_s: float
    rate_window_s: float


def expressions(span: Span) -> dict[str, str]:
    labels = {"namespace": span.namespace, "name": span.name}
    fill = {"engine": ENGINE.format(**labels), "operator": OPERATOR.format(**labels),
            "window": f"{span.rate_window_s:g}s", "long_window": f"{2 * span.rate_window_s:g}s"}
    return {key: query.format(**fill) for key, query in QUERIES.items()}


def duration_s(text: str) -> float:
    """A Prometheus duration ("2s", "500ms", "1m", "1m30s") in seconds."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", text)
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise ValueError(f"not a Prometheus duration: {text!r}")
    return sum(float(n) * units[u] for n, u in parts)


def _get(url: str, path: str, params: dict | None = None, timeout: float = 10.0) -> dict:
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    with urllib.request.urlopen(f"{url}{path}{query}", timeout=timeout) as response:
        body = json.loads(response.read())
    if body.get("status") != "success":
        raise RuntimeError(f"{path}: {body.get('error', body)}")
    return body["data"]


def scrape_interval_s(url: str, default: float = 2.0) -> float:
    """The server's global scrape interval, from its loaded config."""
    config = yaml.safe_load(_get(url, "/api/v1/status/config")["yaml"]) or {}
    return duration_s(str((config.get("global") or {}).get("scrape_interval", f"{default:g}s")))


def points(result: list[dict], t0: float) -> list[list[float | None]]:
    """A query_range result of one series as [[t since t0, value or None for NaN/Inf]]; [] when empty."""
    if not result:
        return []
    out = []
    for stamp, text in result[0]["values"]:
        value = float(text)
        out.append([round(float(stamp) - t0, 2), round(value, 6) if math.isfinite(value) else None])
    return out


def collect(url: str, span: Span) -> dict:
    """Every query of `QUERIES` over the span; a failed or empty query is listed under `missing`."""
    exprs = expressions(span)
    series, missing = {}, {}
    for key, expr in exprs.items():
        params = {"query": expr, "start": f"{span.start:.3f}", "end": f"{span.end:.3f}", "step": f"{span.step_s:g}"}
        try:
            series[key] = points(_get(url, "/api/v1/query_range", params)["result"], span.t0)
        except (OSError, ValueError, RuntimeError) as exc:
            series[key], missing[key] = [], f"error: {exc}"[:200]
            continue
        if not series[key]:
            missing[key] = "no data"
    return {"prometheus": url, "start": round(span.start, 3), "end": round(span.end, 3), "t0": round(span.t0, 3),
            "step_s": span.step_s, "rate_window_s": span.rate_window_s, "queries": exprs,
            "series": series, "missing": missing}


# -- the picture -----------------------------------------------------------------------------------------------
ON, OFF, SLO, LOAD, RATE = "#2ca02c", "#d62728", "#d62728", "#1f77b4", "#ff7f0e"


def _xy(pairs: list) -> tuple[list[float], list[float]]:
    kept = [(t, v) for t, v in pairs or [] if v is not None]
    return [t for t, _ in kept], [v for _, v in kept]


def _window(timeline: dict, key: str) -> str:
    """The range of `key`'s stored query ("10 s" for `[10s]`), so a label says what was queried."""
    m = re.search(r"\[(\d+(?:\.\d+)?)s\]", (timeline.get("queries") or {}).get(key, ""))
    return f"{m.group(1)} s" if m else "?"


def _last(pairs: list) -> float | None:
    values = [v for _, v in pairs or [] if v is not None]
    return values[-1] if values else None


def _spans(pairs: list, value: float) -> list[tuple[float, float]]:
    """[(from, to)] where the series equals `value`."""
    spans, since = [], None
    for t, v in pairs:
        if v == value and since is None:
            since = t
        elif v != value and since is not None:
            spans.append((since, t))
            since = None
    if since is not None:
        spans.append((since, pairs[-1][0]))
    return spans


def _phases(axes, timeline: dict) -> None:
    """Alternating bands for the trace's phases on every panel, their names along the top of the first."""
    for i, (name, start, end) in enumerate(timeline.get("phases") or []):
        for ax in axes:
            if i % 2:
                ax.axvspan(start, end, color="0.955", zorder=0, lw=0)
            ax.axvline(start, color="0.75", lw=0.8, zorder=1)
        axes[0].text((start + end) / 2, 0.97, name, transform=axes[0].get_xaxis_transform(), ha="center",
                     va="top", fontsize=9, color="0.3")


def _legend(ax, handles=None) -> None:
    """The panel's legend in one row above it, right-aligned, beside its title."""
    handles = handles or ax.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], loc="lower right", bbox_to_anchor=(1.0, 1.0),
              ncol=len(handles), fontsize=8, frameon=False, borderaxespad=0.2, handlelength=1.8)


def _switches(axes, timeline: dict) -> None:
    """A dotted vertical line at each speculation switch (from the run's Events): on every panel for on
    and off, on the speculation panel alone for a depth retune."""
    for s in timeline.get("switches") or []:
        for ax in axes if s["reason"] != "DepthRetuned" else axes[2:3]:
            ax.axvline(s["t"], color=ON if s["enabled"] else OFF, lw=1.0, ls=":", zorder=2)
        label = f"on k={s['k']}" if s["enabled"] else "off"
        axes[2].annotate(f"{label}\n{s['reason']}", (s["t"], 1.0), xycoords=axes[2].get_xaxis_transform(),
                         xytext=(3, -2), textcoords="offset points", fontsize=7, va="top",
                         color=ON if s["enabled"] else OFF)


def _load_panel(ax, timeline: dict) -> None:
    s = timeline["series"]
    t, clients = _xy(timeline.get("clients"))
    ax.fill_between(t, clients, step="post", color=LOAD, alpha=0.18, lw=0)
    ax.step(t, clients, where="post", color=LOAD, lw=1.5, label="clients sending (trace)")
    batch = _xy(s.get("batch"))
    ax.plot(*batch, color="0.15", lw=1.4, label="mean batch (engines)")
    ax.set_ylabel("clients, sequences")
    ax.set_ylim(0, max(clients + batch[1] + [1]) * 1.22)         # headroom for the phase names
    rate = ax.twinx()
    rate_xy = _xy(s.get("request_rate"))
    rate.plot(*rate_xy, color=RATE, lw=1.2,
              label=f"finished requests/s over {_window(timeline, 'request_rate')} (engines)")
    rate.set_ylabel("requests/s", color=RATE)
    rate.tick_params(axis="y", colors=RATE)
    rate.set_ylim(0, max(rate_xy[1] + [0.1]) * 1.22)
    _legend(ax, ax.get_legend_handles_labels()[0] + rate.get_legend_handles_labels()[0])
    ax.set_title("offered load", loc="left", fontsize=10, pad=4)


def _replicas_panel(ax, timeline: dict) -> None:
    s = timeline["series"]
    ax.step(*_xy(s.get("ready_replicas")), where="post", color=LOAD, lw=2.0, label="ready")
    desired = _xy(s.get("desired_replicas"))
    if desired[0]:
        ax.step(*desired, where="post", color="0.15", lw=1.2, ls="--", label="desired")
    elif timeline.get("spec_replicas") is not None:
        ax.axhline(timeline["spec_replicas"], color="0.15", lw=1.2, ls="--",
                   label=f"desired: spec.replicas = {timeline['spec_replicas']} (fixed, no autoscaling)")
    ax.set_ylim(0, max(desired[1] + _xy(s.get("ready_replicas"))[1] + [timeline.get("spec_replicas") or 1]) + 1)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("replicas")
    _legend(ax)
    ax.set_title("replicas (operator)", loc="left", fontsize=10, pad=4)


def _speculation_panel(ax, timeline: dict) -> None:
    s = timeline["series"]
    enabled = [[t, v] for t, v in s.get("speculation_enabled") or [] if v is not None]
    for value, color, label in ((1, ON, "on"), (0, OFF, "off")):
        for i, (start, end) in enumerate(_spans(enabled, value)):
            ax.axvspan(start, end, ymax=0.9, color=color, alpha=0.15 if value else 0.09, lw=0,
                       label=None if i else label)
    t, k = _xy(s.get("speculation_k"))
    on = dict((tt, v) for tt, v in enabled)
    k_on = [kk if on.get(tt, 1) == 1 else 0 for tt, kk in zip(t, k)]
    ax.step(t, k_on, where="post", color=ON, lw=2.0, label="k while on (0: off)")
    ax.set_ylim(0, max(k + [1]) * 1.25 + 0.5)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("draft depth k")
    _legend(ax)
    ax.set_title("speculation (operator)", loc="left", fontsize=10, pad=4)


def _latency_panel(ax, timeline: dict, metric: str, title: str) -> None:
    s = timeline["series"]
    ms = lambda pairs: [[t, None if v is None else v * 1000] for t, v in pairs or []]     # noqa: E731
    window = _window(timeline, f"{metric}_p99")
    ax.plot(*_xy(ms(s.get(f"{metric}_p99"))), color=LOAD, lw=1.4, label=f"p99 over {window} (engines)")
    ax.step(*_xy(ms(s.get(f"{metric}_p99_operator"))), where="post", color="0.2", lw=1.0,
            label="p99 the controller saw (its window)")
    target = _last(s.get(f"{metric}_slo")) or (timeline.get("slo_s") or {}).get(metric)
    if target is not None:
        ax.axhline(target * 1000, color=SLO, ls="--", lw=1.5, label=f"SLO {target * 1000:g} ms")
        values = _xy(ms(s.get(f"{metric}_p99")))[1] + _xy(ms(s.get(f"{metric}_p99_operator")))[1]
        if values and max(values) > 4 * target * 1000:
            ax.set_yscale("log")
    ax.set_ylabel("ms")
    ax.set_ylim(bottom=0 if ax.get_yscale() == "linear" else None)
    _legend(ax)
    ax.set_title(title, loc="left", fontsize=10, pad=4)


def _budget_panel(ax, timeline: dict) -> None:
    s = timeline["series"]
    ax.step(*_xy(s.get("burn_rate_5m")), where="post", color=LOAD, lw=1.4, label="5m burn rate (operator)")
    ax.step(*_xy(s.get("burn_rate_5m_rule")), where="post", color=RATE, lw=1.2,
            label="specfleet:slo_burn_rate:5m (rule)")
    ax.axhline(1.0, color=SLO, ls="--", lw=1.5, label="1: budget lasts the SLO period")
    ax.set_ylim(bottom=0)
    ax.set_ylabel("burn rate")
    _legend(ax)
    ax.set_title("error budget", loc="left", fontsize=10, pad=4)


def render(timeline: dict, out: Path, title: str, subtitle: str = "") -> Path:
    """Draw `timeline` (collect()'s JSON plus `clients`, `phases`, `switches`, `slo_s`, `spec_replicas`) as
    a PNG at `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(6, 1, figsize=(12, 14), sharex=True,
                             gridspec_kw={"height_ratios": [1.3, 0.6, 0.8, 1, 1, 0.9]})
    _load_panel(axes[0], timeline)
    _replicas_panel(axes[1], timeline)
    _speculation_panel(axes[2], timeline)
    _latency_panel(axes[3], timeline, "ttft", "time to first token, p99")
    _latency_panel(axes[4], timeline, "itl", "inter-token latency, p99")
    _budget_panel(axes[5], timeline)
    _phases(axes, timeline)
    _switches(axes, timeline)
    for ax in axes:
        ax.grid(axis="y", color="0.88", lw=0.6)
        ax.margins(x=0)
    axes[-1].set_xlabel("seconds since the trace started")
    fig.suptitle(title, fontsize=12, x=0.01, y=0.995, ha="left", va="top")
    fig.text(0.01, 0.972, subtitle, fontsize=8, color="0.35", va="top")
    footer = (f"Prometheus range queries, step {timeline['step_s']:g} s; dotted verticals: speculation on/off "
              f"switches (Events; depth retunes on the speculation panel only). {_missing_note(timeline)}")
    fig.text(0.01, 0.005, footer, fontsize=7.5, color="0.35")
    fig.tight_layout(rect=(0, 0.015, 1, 0.966), h_pad=1.6)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _missing_note(timeline: dict) -> str:
    missing = set(timeline.get("missing") or {})
    if timeline.get("spec_replicas") is not None:
        missing.discard("desired_replicas")          # drawn from spec.replicas instead
    return f"No data: {', '.join(sorted(missing))}." if missing else ""
