"""summary.json, the game-day's machine-readable report: one model for the game-day that writes it
and every reader (the simulator's `--from-report`, benchmarks/gameday.py).

Seconds are from the fault's injection; null means not measured. Unknown keys are errors. The
writer fills every field; a reader's input may leave out what it has not (an experiment that never
ran has no verdict, a hand-made report may give only `name`, `fault_class` and `measured`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat

SCHEMA: Literal["gpufleet.gameday/v1"] = "gpufleet.gameday/v1"


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class MeasuredDoc(_M):
    detect_seconds: NonNegativeFloat | None = None
    isolate_seconds: NonNegativeFloat | None = None
    recover_seconds: NonNegativeFloat | None = None
    return_seconds: NonNegativeFloat | None = None
    lost_steps: int | None = None
    recovered: bool | None = None
    interrupted: bool | None = None
    availability: float | None = None


class BudgetDoc(_M):
    detect_seconds: float
    isolate_seconds: float | None = None
    recover_seconds: float
    source: str | None = None  # "stack" | "override"


class CheckDoc(_M):
    name: str
    measured: float | None = None
    budget: float | None = None
    outcome: Literal["PASS", "FAIL", "UNKNOWN"]
    detail: str


class ExperimentDoc(_M):
    name: str
    fault_class: str | None  # a FaultClass value; null: the experiment never ran far enough
    measured: MeasuredDoc = Field(default_factory=MeasuredDoc)
    title: str | None = None
    file: str | None = None
    fault_id: str | None = None
    status: str | None = None  # the journal's: completed | failed | aborted | interrupted | missing
    outcome: Literal["PASS", "FAIL", "UNKNOWN"] | None = None  # every check combined
    verdict: Literal["PASS", "FAIL", "UNKNOWN"] | None = None  # the SLO checks only
    expected: Literal["PASS", "FAIL"] | None = None
    result: Literal["met", "missed", "unjudged"] | None = None
    result_label: str | None = None  # "failed as expected" for a breach test that met its FAIL
    budget: BudgetDoc | None = None
    checks: list[CheckDoc] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    journal: str | None = None  # relative to the report directory
    started_at: float | None = None
    wall_seconds: float | None = None
    capacity: dict[str, Any] | None = None  # the capacity_during_fault probe's output
    healing: dict[str, Any] | None = None  # gpufleet.chaos.steady's HealReport before this experiment
    # Diagnostic bundles the fault's detection collected (gpufleet.gameday.bundles), copied into the report.
    bundles: list[dict[str, Any]] = Field(default_factory=list)
    timeline: dict[str, Any] | None = None  # gpufleet.slo.Timeline


class SummaryDoc(_M):
    schema_: Literal["gpufleet.gameday/v1"] = Field(SCHEMA, alias="schema")
    experiments: list[ExperimentDoc]
    stack: str | None = None
    backend: str | None = None
    started_at: float | None = None
    wall_seconds: float | None = None  # the whole game-day, sandbox bring-up included
    setup_seconds: float | None = None
    outcome: Literal["PASS", "FAIL", "UNKNOWN"] | None = None
    result: Literal["met", "missed", "unjudged"] | None = None
    exit_code: int | None = None
    counts: dict[str, int] = Field(default_factory=dict)
    failed_as_expected: list[str] = Field(default_factory=list)
    interrupted: bool = False
    not_run: list[str] = Field(default_factory=list)
    left_out_known_issues: list[str] = Field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)
