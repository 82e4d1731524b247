"""The game-day: run a suite of chaos experiments, judge each against the stack's recovery
budgets, and write JSON / JUnit / HTML reports."""

from gpufleet.gameday.contract import BUDGET_PROBE, CAPACITY_PROBE, TIMELINE_PROBE, calls
from gpufleet.gameday.evaluate import (
    EXIT_CODES,
    ExperimentResult,
    Result,
    evaluate,
    suite_result,
)
from gpufleet.gameday.journal import JournalFacts, read_journal
from gpufleet.gameday.report import SuiteRun, html_report, junit_xml, summary_dict, write_report
from gpufleet.gameday.runner import GamedayOptions, Listener, plan, run_gameday, stack_budgets
from gpufleet.gameday.suite import (
    Expectations,
    Experiment,
    discover,
    load_experiment,
    parse_experiment,
    select,
)

__all__ = [
    "BUDGET_PROBE",
    "CAPACITY_PROBE",
    "EXIT_CODES",
    "TIMELINE_PROBE",
    "Expectations",
    "Experiment",
    "ExperimentResult",
    "GamedayOptions",
    "JournalFacts",
    "Listener",
    "Result",
    "SuiteRun",
    "calls",
    "discover",
    "evaluate",
    "html_report",
    "junit_xml",
    "load_experiment",
    "parse_experiment",
    "plan",
    "read_journal",
    "run_gameday",
    "select",
    "stack_budgets",
    "suite_result",
    "summary_dict",
    "write_report",
]
