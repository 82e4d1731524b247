"""One timeline plot per experiment, as a base64 PNG for the single-file HTML report.

Uses matplotlib's object API with the Agg canvas (no pyplot, no global state, no display).
"""

from __future__ import annotations

import base64
import io

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from gpufleet.gameday.evaluate import ExperimentResult
from gpufleet.slo import EventKind

_MARKS: tuple[tuple[EventKind, str, str], ...] = (
    (EventKind.INJECTED, "fault", "#d62728"),
    (EventKind.DETECTED, "detect", "#ff7f0e"),
    (EventKind.ISOLATED, "isolate", "#9467bd"),
    (EventKind.INTERRUPTED, "stall", "#7f7f7f"),
    (EventKind.RESUMED, "resume", "#2ca02c"),
    (EventKind.REVERTED, "revert", "#8c564b"),
    (EventKind.RETURNED, "return", "#1f77b4"),
)


def _png(fig: Figure) -> str:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def timeline_png(r: ExperimentResult) -> str:
    """Events relative to the injection (every occurrence; the measured first ones labelled),
    budgets as dashed lines, node unavailability as bars."""
    fig = Figure(figsize=(9.0, 2.8))
    ax = fig.add_subplot(1, 1, 1)
    tl, m = r.timeline, r.measurement
    if tl is None or m is None or m.injected_at is None:
        ax.set_axis_off()
        reason = "no timeline" if tl is None else "no injection in the timeline"
        ax.text(0.5, 0.5, f"{r.name}: {reason} - nothing to plot", ha="center", va="center")
        return _png(fig)
    t0 = m.injected_at
    nodes = sorted(tl.nodes_unavailable)
    for i, node in enumerate(nodes):
        spans = [(a - t0, (tl.window_end if b is None else b) - a) for a, b in tl.nodes_unavailable[node]]
        ax.broken_barh(spans, (i + 0.6, 0.8), facecolors="#c7c7c7")
    top = len(nodes) + 1.5
    first = {
        EventKind.DETECTED: m.time_to_detect, EventKind.ISOLATED: m.time_to_isolate,
        EventKind.RESUMED: m.time_to_recover, EventKind.RETURNED: m.time_to_return, EventKind.INJECTED: 0.0,
    }
    for kind, label, color in _MARKS:
        times = [e.at - t0 for e in tl.events if e.kind is kind]
        for x in times:
            ax.axvline(x, color=color, alpha=0.35, linewidth=1)
        at = first.get(kind, min(times) if times else None)
        if at is not None:
            ax.axvline(at, color=color, linewidth=2, label=f"{label} {at:+.1f} s")
    if r.budget is not None:
        # One dashed line per distinct budget value, labelled with every budget it carries.
        labels: dict[float, list[str]] = {}
        for value, label in ((r.budget.detect_seconds, "detect"), (r.budget.isolate_seconds, "isolate"),
                             (r.budget.recover_seconds, "recover")):
            if value is not None:
                labels.setdefault(value, []).append(label)
        for value, names in labels.items():
            ax.axvline(value, color="black", linestyle="--", linewidth=0.8)
            ax.text(value, top, "/".join(names) + " budget", rotation=90, va="top", ha="right", fontsize=7)
    if m.interrupted and not m.recovered:
        ax.text(0.99, 0.05, "workload never resumed", transform=ax.transAxes, ha="right", color="#d62728")
    # Keep every budget line in view: a recovery that met a 60 s budget at 55 s must show the 60.
    budgets = [] if r.budget is None else [
        v for v in (r.budget.detect_seconds, r.budget.isolate_seconds, r.budget.recover_seconds)
        if v is not None
    ]
    right = max([tl.window_end - t0, *budgets])
    ax.set_xlim(tl.window_start - t0, right + 0.02 * max(right, 1.0))
    ax.set_ylim(0, top)
    ax.set_yticks([i + 1 for i in range(len(nodes))], nodes)
    ax.set_xlabel("seconds from fault injection")
    ax.set_title(f"{r.name} ({r.fault_class}) - {r.verdict.value}", fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    # Room on the right for the legend (tight_layout cannot place an outside legend and warns).
    fig.subplots_adjust(left=0.08, right=0.80, top=0.88, bottom=0.2)
    return _png(fig)


def serving_png(r: ExperimentResult) -> str:
    """The load an experiment ran under, per second from the fault's injection: requests due and
    served, the error rate (failed and missed over due) and the p99 of served requests, with the
    fault window shaded and the injection, isolation and return marked."""
    s = r.serving
    fig = Figure(figsize=(9.0, 4.2))
    if s is None or not s.seconds or s.fault is None:
        ax = fig.add_subplot(1, 1, 1)
        ax.set_axis_off()
        ax.text(0.5, 0.5, f"{r.name}: the load recorded no request - nothing to plot",
                ha="center", va="center")
        return _png(fig)
    t0 = s.fault[0]
    xs = [p.t - t0 for p in s.seconds]
    rate, err, p99 = fig.subplots(3, 1, sharex=True)
    rate.step(xs, [p.due for p in s.seconds], where="post", color="#7f7f7f", label="due")
    rate.step(xs, [p.ok for p in s.seconds], where="post", color="#2ca02c", label="served")
    rate.set_ylabel("req/s", fontsize=8)
    err.step(xs, [100 * (p.due - p.ok) / p.due if p.due else 0.0 for p in s.seconds], where="post",
             color="#d62728")
    err.set_ylabel("errors %", fontsize=8)
    p99.step(xs, [float("nan") if p.p99_ms is None else p.p99_ms for p in s.seconds], where="post",
             color="#1f77b4")
    p99.set_ylabel("p99 ms", fontsize=8)
    p99.set_xlabel("seconds from fault injection")
    marks = [(EventKind.ISOLATED, "#9467bd"), (EventKind.RETURNED, "#1f77b4")]
    for ax in (rate, err, p99):
        ax.axvspan(0.0, s.fault[1] - t0, color="#d62728", alpha=0.08)
        ax.axvline(0.0, color="#d62728", linewidth=1.5)
        for kind, color in marks:
            for e in (r.timeline.events if r.timeline is not None else []):
                if e.kind is kind:
                    ax.axvline(e.at - t0, color=color, linewidth=1, alpha=0.7)
        ax.tick_params(labelsize=7)
    availability = s.figures.get("availability")
    shown = "-" if not isinstance(availability, float) else f"{availability:.3%}"
    rate.set_title(f"{r.name}: {shown} of due requests served over the run", fontsize=10)
    rate.legend(loc="lower left", fontsize=7)
    fig.subplots_adjust(left=0.08, right=0.97, top=0.92, bottom=0.12, hspace=0.15)
    return _png(fig)
