"""Out-of-sample checks: fit a failure rate on one published source, predict a figure of another
that was not used for fitting, and report the error (docs/simulator.md, "Validation").

Every figure is from shared/reference/failure-data.md with its tag (P paper, S secondary summary,
D our arithmetic, "quoted"). The prediction is a simulation (exponential faults at the fitted
per-node rate, the job restarted in place), so the error measures how well a rate carries from one
fleet to another, not the simulator's arithmetic (which the closed-form tests check).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from gpufleet.core.taxonomy import FaultClass, LadderAction
from gpufleet.sim.params import ClassHandling, FaultKind, SimParams
from gpufleet.sim.runner import run_replications
from gpufleet.sim.stats import Estimate, mean_ci

Metric = Literal["job_mtbf_hours", "interruptions_per_1000_nodes_day"]

LLAMA3 = ("Llama 3 405B (Meta 2024, P): 419 unexpected interruptions in 54 days on 2,048 x 8 H100 "
          "= 3.79 per 1,000 node-days (D); the catalog's rates")
RSC1 = "Kokolis et al. (HPCA 2025, S): RSC-1 node failure rate 6.50 per 1,000 node-days"
RSC2 = "Kokolis et al. (HPCA 2025, S): RSC-2 node failure rate 2.34 per 1,000 node-days"


@dataclass(frozen=True)
class Case:
    name: str
    fit_source: str
    per_thousand_node_days: float  # the fitted per-node rate
    target_source: str
    metric: Metric
    published: float
    gpus: int
    gpus_per_node: int
    days: float
    same_source: bool = False  # fit and target from one paper: a scaling check, not out-of-sample


CASES: tuple[Case, ...] = (
    Case("llama3 -> RSC job MTTF at 1,024 GPUs", LLAMA3, 419 / (2048 * 54) * 1000,
         "Kokolis et al. (HPCA 2025, quoted): measured job MTTF 7.9 h at 1,024 GPUs",
         "job_mtbf_hours", 7.9, 1024, 8, 365),
    Case("llama3 -> FT-HSDP interruption rate at 32K H100", LLAMA3, 419 / (2048 * 54) * 1000,
         "Meta FT-HSDP (S): 2.3 interruptions per 1,000 servers per day at 32K H100",
         "interruptions_per_1000_nodes_day", 2.3, 32_768, 8, 30),
    Case("RSC-1 -> Llama 3 job MTBF at 16,384 GPUs", RSC1, 6.50,
         "Llama 3 (Meta 2024, P): 54 d x 24 h / 419 = 3.09 h (D)",
         "job_mtbf_hours", 54 * 24 / 419, 16_384, 8, 54),
    Case("RSC-2 -> Llama 3 job MTBF at 16,384 GPUs", RSC2, 2.34,
         "Llama 3 (Meta 2024, P): 54 d x 24 h / 419 = 3.09 h (D)",
         "job_mtbf_hours", 54 * 24 / 419, 16_384, 8, 54),
    Case("RSC 8-GPU job MTTF -> RSC 1,024-GPU job MTTF", "Kokolis et al. (HPCA 2025, quoted): "
         "job MTTF 47.7 days at 8 GPUs = 20.96 per 1,000 node-days (D)", 1000 / 47.7,
         "Kokolis et al. (HPCA 2025, quoted): measured job MTTF 7.9 h at 1,024 GPUs",
         "job_mtbf_hours", 7.9, 1024, 8, 365, same_source=True),
)


@dataclass(frozen=True)
class Row:
    case: Case
    predicted: Estimate
    analytic: float  # the same prediction in closed form (rate x size), for checking

    @property
    def error(self) -> float:
        """Relative error of the prediction against the published figure."""
        return (self.predicted.mean - self.case.published) / self.case.published

    def as_dict(self) -> dict[str, Any]:
        c = self.case
        return {"name": c.name, "fit": c.fit_source,
                "fitted_per_thousand_node_days": c.per_thousand_node_days,
                "target": c.target_source, "metric": c.metric, "published": c.published,
                "predicted": self.predicted.as_dict(), "analytic": self.analytic,
                "relative_error": self.error, "same_source": c.same_source}


def case_params(c: Case) -> SimParams:
    """One exponential fault stream at the fitted rate; handling is immaterial for interruption
    counts (a fault during recovery also counts), so it is kept short."""
    nodes = c.gpus // c.gpus_per_node
    kind = FaultKind(fault_id="fitted", fault_class=FaultClass.NODE_CRASH, cause="fitted rate",
                     source=c.fit_source, per_node_hour=c.per_thousand_node_days / 1000.0 / 24.0,
                     action=LadderAction.RESTART_JOB)
    handling = {cls: ClassHandling(10.0, "validation", 0.0, "validation") for cls in FaultClass}
    return SimParams(pool="validation", accelerator="any", job_nodes=nodes, gpus_per_node=c.gpus_per_node,
                     spares=0, spare_mode="warm", nodes_per_rack=4, nodes_per_leaf=32, days=c.days,
                     kinds=(kind,), handling=handling, restart_seconds=60.0,
                     sources={"validation": c.fit_source})


def analytic(c: Case) -> float:
    per_node_day = c.per_thousand_node_days / 1000.0
    if c.metric == "job_mtbf_hours":
        return 24.0 / (per_node_day * c.gpus / c.gpus_per_node)
    return per_node_day * 1000.0


def predict(c: Case, seed: int = 1, runs: int = 20, workers: int | None = 1) -> Row:
    p = case_params(c)
    rs = run_replications(p, seed, runs, workers)
    ints = np.array([r.interruptions for r in rs], dtype=float)
    if c.metric == "job_mtbf_hours":  # horizon / mean interruptions, its interval mapped through
        n = mean_ci(ints)
        hours = p.horizon_seconds / 3600.0
        est = Estimate(hours / n.mean, hours / n.high, hours / max(n.low, 1e-9), n.n)
    else:
        est = mean_ci(ints / (p.job_nodes / 1000.0) / p.days)
    return Row(c, est, analytic(c))


def out_of_sample(seed: int = 1, runs: int = 20, workers: int | None = 1) -> list[Row]:
    return [predict(c, seed, runs, workers) for c in CASES]


def table_markdown(rows: list[Row]) -> str:
    lines = ["| fit on | predict | published | predicted (95% CI) | error |", "|---|---|---|---|---|"]
    for r in rows:
        c = r.case
        tag = " (same paper)" if c.same_source else ""
        lines.append(f"| {c.fit_source} | {c.target_source}{tag} | {c.published:.2f} | "
                     f"{r.predicted.mean:.2f} [{r.predicted.low:.2f}, {r.predicted.high:.2f}] | "
                     f"{r.error:+.0%} |")
    return "\n".join(lines)
