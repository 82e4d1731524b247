"""Plots of a simulation (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from gpufleet.sim.stats import Estimate
from gpufleet.sim.sweeps import Point


def _line(points: Sequence[Point], xlabel: str, title: str, target: float | None, path: Path,
          logx: bool = False) -> Path:
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    xs = [pt.x for pt in points]
    ax.plot(xs, [pt.ettr.mean for pt in points], marker="o")
    ax.fill_between(xs, [pt.ettr.low for pt in points], [pt.ettr.high for pt in points], alpha=0.25,
                    label="95% CI")
    if target is not None:
        ax.axhline(target, color="red", linestyle="--", label=f"SLO {target:g}")
    if logx:
        ax.set_xscale("symlog", linthresh=1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("ETTR")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def ettr_vs_interval_plot(points: Sequence[Point], target: float | None, path: Path) -> Path:
    return _line(points, "checkpoint interval (minutes)", "ETTR vs checkpoint interval", target, path)


def ettr_vs_spares_plot(points: Sequence[Point], target: float | None, path: Path) -> Path:
    return _line(points, "spare nodes", "ETTR vs spares", target, path, logx=True)


def lost_by_cause_plot(lost: dict[str, Estimate], path: Path) -> Path:
    items = sorted(lost.items(), key=lambda kv: kv[1].mean)
    fig, ax = plt.subplots(figsize=(7.0, 0.35 * len(items) + 1.5))
    names = [k for k, _ in items]
    means = [v.mean for _, v in items]
    err = [[v.mean - v.low for _, v in items], [v.high - v.mean for _, v in items]]
    ax.barh(names, means, xerr=err, capsize=2)
    ax.set_xlabel("lost GPU-hours per run (mean, 95% CI)")
    ax.set_title("Lost time by cause")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
