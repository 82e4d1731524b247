"""Reliability simulator: the declared cluster at full scale over months (SimPy, Monte Carlo).

Inputs: a stack (StackSpec), the fault catalog's published rates, an optional scenario file and an
optional game-day report. Outputs: ETTR, interruptions, MTBF, lost GPU-hours by cause, node
availability and the probability of running out of spares, each with a 95% confidence interval.
See docs/simulator.md.
"""

from gpufleet.sim.accounting import (
    Accounting,
    account,
    ettr_closed_form,
    ettr_mixed_handling,
    ettr_renewal,
)
from gpufleet.sim.engine import Replication, ReplicationResult, ScriptedFault, simulate_once
from gpufleet.sim.gameday_input import Measured, load_report, parse_report
from gpufleet.sim.metrics import Metrics, ettr_values, summarize
from gpufleet.sim.params import ClassHandling, FaultKind, SimParams, UpgradeWave
from gpufleet.sim.recommend import Candidate, recommend
from gpufleet.sim.resolve import catalog_kinds, resolve
from gpufleet.sim.runner import replication_seeds, run_replications
from gpufleet.sim.scenario import Scenario, load_scenario, parse_scenario
from gpufleet.sim.stats import Estimate, mean_ci, proportion_ci
from gpufleet.sim.study import Study, StudyProgress, report_markdown, run_study, write_study
from gpufleet.sim.validation import out_of_sample

__all__ = [
    "Accounting",
    "Candidate",
    "ClassHandling",
    "Estimate",
    "FaultKind",
    "Measured",
    "Metrics",
    "Replication",
    "ReplicationResult",
    "Scenario",
    "ScriptedFault",
    "SimParams",
    "Study",
    "StudyProgress",
    "UpgradeWave",
    "account",
    "catalog_kinds",
    "ettr_closed_form",
    "ettr_mixed_handling",
    "ettr_renewal",
    "ettr_values",
    "load_report",
    "load_scenario",
    "mean_ci",
    "out_of_sample",
    "parse_report",
    "parse_scenario",
    "proportion_ci",
    "recommend",
    "replication_seeds",
    "report_markdown",
    "resolve",
    "run_replications",
    "run_study",
    "simulate_once",
    "summarize",
    "write_study",
]
