"""Typed schema of the fault catalog (YAML data under `gpufleet/catalog/data/`).

Each entry says what the fault is, how it is detected (an alert on dcgm-exporter / node_exporter
metric names, and a local health check), what to do about it on the remediation ladder, how to
escalate and deduplicate, how to inject it (one typed injection, gpufleet.catalog.injection, with
per-backend overrides), how often it happens (with the source of the figure) and which runbook an
on-call engineer reads.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from gpufleet.catalog.injection import HOST_SIGNALS as HOST_SIGNALS
from gpufleet.catalog.injection import AnyInjection, Injection
from gpufleet.core.taxonomy import FaultClass, LadderAction, Severity

_DURATION = r"^[0-9]+(ms|s|m|h|d)$"
ALERT_NAME = r"^[A-Z][A-Za-z0-9]+$"
Backend = Literal["sandbox", "slurm", "kubernetes"]


class Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True
    )


class Alert(Model):
    """A Prometheus alert in the monitoring-mixin style; `runbook_url` is derived, never written."""

    name: Annotated[str, Field(pattern=ALERT_NAME)]
    expr: str
    for_: Annotated[str, Field(alias="for", pattern=_DURATION)]
    summary: str  # static text
    description: str  # may use {{ $labels.x }} / {{ $value }}
    # A single scrape must not page: `for:` is raised to this many scrape intervals of the stack the
    # rules are rendered for (gpufleet.catalog.rules.RuleSettings).
    min_scrapes: Annotated[int, Field(ge=2)] | None = None

    @model_validator(mode="after")
    def _static_summary(self) -> Alert:
        if "{{" in self.summary:
            raise ValueError("summary must be static text; put templates in description")
        if "{{" not in self.description:
            raise ValueError("description must be templated (name the node/GPU with {{ $labels.x }})")
        return self


class Recording(Model):
    """A recording rule an alert needs (a latch, a per-node count); evaluated before the alerts of
    its group. It may read its own previous value, which is how a latch holds (ADR 0040)."""

    record: Annotated[str, Field(pattern=r"^gpufleet:[a-z0-9_]+:[a-z0-9_]+$")]
    expr: str


class HealthCheck(Model):
    """What the node-local checker (`gpufleet node-health`) evaluates for this fault.

    source:
      xid        - the XID codes in `xids` seen in the kernel log / XID field since the last check
      dcgm-field - DCGM field `fieldId` compared with `threshold` (`op`), per GPU
      exporter-field - a vendor exporter's per-GPU series `metric` (AMD's device-metrics-exporter,
                   Huawei's npu-exporter; exporters.yaml) compared with `threshold` (`op`)
      link       - fabric port state (down = fault) or error-counter growth
      mount      - the checkpoint mount answers a stat within `threshold` seconds
      host       - a host signal (`signal`, see HOST_SIGNALS) compared with `threshold` (`op`)
    For `link`, `signal: absent` matches a port whose device is gone (a failed NIC), and no
    signal matches a port that is down.
    """

    source: Literal["xid", "dcgm-field", "exporter-field", "link", "mount", "host"]
    xids: list[int] | None = None
    field_id: int | None = None
    metric: Annotated[str, Field(pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$")] | None = None
    op: Literal[">", ">=", "==", "!="] = ">"
    threshold: float | None = None
    signal: str | None = None

    @model_validator(mode="after")
    def _fields_for_source(self) -> HealthCheck:
        if self.source == "xid" and not self.xids:
            raise ValueError("source xid needs xids")
        if self.source == "dcgm-field" and (self.field_id is None or self.threshold is None):
            raise ValueError("source dcgm-field needs fieldId and threshold")
        if self.source == "exporter-field" and (self.metric is None or self.threshold is None):
            raise ValueError("source exporter-field needs metric and threshold")
        if self.source != "exporter-field" and self.metric is not None:
            raise ValueError(f"source {self.source} takes no metric")
        if self.source == "host" and (self.signal not in HOST_SIGNALS or self.threshold is None):
            raise ValueError(f"source host needs threshold and a signal of {sorted(HOST_SIGNALS)}")
        if self.source == "link" and self.signal not in (None, "absent"):
            raise ValueError("source link takes no signal or signal: absent")
        if self.source not in ("host", "link") and self.signal is not None:
            raise ValueError(f"source {self.source} takes no signal")
        return self


class Escalation(Model):
    """Climb the ladder when the fault repeats on the same GPU/node within a window."""

    repeats: Annotated[int, Field(ge=2)]
    window_hours: Annotated[float, Field(gt=0)]
    to: LadderAction


class Dedup(Model):
    """How to keep bursts and echoes from acting twice (NVSentinel lesson: XID 45 bursts after one
    crash quarantined 77 nodes).

    window_seconds: repeats of this fault on one GPU within the window count once.
    secondary_to: this fault is an echo of the listed faults ("any" = any other XID): when one of
      them was seen on the node within the window, act on that one, not on this one.
    """

    window_seconds: Annotated[float, Field(gt=0)] = 300
    secondary_to: list[str] = Field(default_factory=list)


class Rate(Model):
    """Published rate of the fault, with its source (shared/reference/failure-data.md).

    Exactly one of per_million_gpu_hours / per_thousand_node_days. `share` is the part of the
    published cause attributed to this entry when a cause (e.g. "Faulty GPU") spans several faults.
    """

    per_million_gpu_hours: Annotated[float, Field(ge=0)] | None = None
    per_thousand_node_days: Annotated[float, Field(ge=0)] | None = None
    share: Annotated[float, Field(gt=0, le=1)] = 1.0
    cause: str  # the published root-cause row
    source: str  # paper / page, and the failure-data.md tag (P, A, S, D)

    @model_validator(mode="after")
    def _one_unit(self) -> Rate:
        if (self.per_million_gpu_hours is None) == (self.per_thousand_node_days is None):
            raise ValueError("give exactly one of perMillionGpuHours or perThousandNodeDays")
        return self

    def per_gpu_hour(self, gpus_per_node: int) -> float:
        """Rate per GPU-hour after the share is applied."""
        if self.per_million_gpu_hours is not None:
            return self.per_million_gpu_hours * self.share / 1e6
        assert self.per_thousand_node_days is not None
        return self.per_thousand_node_days * self.share / 1000.0 / 24.0 / gpus_per_node


class Fault(Model):
    id: Annotated[str, Field(pattern=r"^[a-z0-9]+(-[a-z0-9]+)*$")]
    fault_class: FaultClass = Field(alias="class")
    severity: Severity
    title: str
    xid: Annotated[int, Field(ge=1, le=255)] | None = None
    # Whose accelerator the fault is about (its exporter and tools); None: not vendor-specific.
    # XIDs and DCGM fields are NVIDIA's.
    vendor: Literal["nvidia", "amd", "huawei"] | None = None
    dcgm_health: Literal["PASS", "WARN", "FAIL"] | None = None
    alert: Alert | None = None
    records: list[Recording] = Field(default_factory=list)
    exemption: str | None = None  # why there is no alert (must say how it IS detected)
    health_check: HealthCheck | None = None
    action: LadderAction
    escalation: Escalation | None = None
    dedup: Dedup | None = None
    # One injection for every backend; a backend may replace it (another method or other parameters,
    # e.g. a rate cap that a real HCA's netdev would not show). Whether a backend CAN inject the
    # method is its declared capability (gpufleet.chaos.backends), not the presence of an entry here.
    injection: Injection | None = None
    injection_overrides: dict[Backend, Injection] = Field(default_factory=dict)
    # Why no backend can inject the fault; the shipped catalog gives an injection or this.
    no_injection: str | None = None
    rate: Rate | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Fault:
        if (self.alert is None) == (self.exemption is None):
            raise ValueError("give an alert, or an exemption saying why there is none")
        if self.injection_overrides and self.injection is None:
            raise ValueError("injectionOverrides replace an injection: give `injection` too")
        if self.injection is not None and self.no_injection is not None:
            raise ValueError("give an injection or noInjection (why none is possible), not both")
        if self.escalation and self.escalation.to.rank <= self.action.rank:
            raise ValueError(
                f"escalation.to ({self.escalation.to.value}) must be above action "
                f"({self.action.value}) on the ladder"
            )
        return self

    def injection_for(self, backend: str) -> AnyInjection | None:
        """The injection `backend` is given: its override, else the common one (None: none)."""
        for name, inj in self.injection_overrides.items():
            if name == backend:
                return inj
        return self.injection

    @property
    def gpu_vendor(self) -> str | None:
        """Whose accelerators the fault can happen on: `vendor`, else NVIDIA for a fault spoken in
        XIDs or DCGM fields (only NVIDIA has them), else None (any node)."""
        if self.vendor is not None:
            return self.vendor
        dcgm = (self.xid is not None or self.dcgm_health is not None
                or (self.injection is not None and self.injection.method == "dcgm-inject")
                or (self.health_check is not None and self.health_check.source == "dcgm-field"))
        return "nvidia" if dcgm else None

    @property
    def runbook(self) -> str | None:
        """Runbook file, derived from the alert name (convention enforced by code)."""
        return f"runbooks/{self.alert.name}.md" if self.alert else None


def runbook_url(alert_name: str, base: str) -> str:
    """The runbook link of an alert, derived from its name (kubernetes-mixin's convention)."""
    if not re.fullmatch(ALERT_NAME, alert_name):
        raise ValueError(f"not an alert name: {alert_name}")
    return f"{base.rstrip('/')}/{alert_name}.md"


def parse_fault(data: Any) -> Fault:
    return Fault.model_validate(data)
