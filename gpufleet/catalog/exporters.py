"""Where every series the rules read comes from: the exporters, their labels and the setting that
makes them export it (`gpufleet/catalog/exporters.yaml`), and the checks and files derived from it.

- `signal_problems`: every metric an alert, recording rule or dashboard panel reads is declared by
  an exporter (or is a recording rule of the catalog); `gpufleet generate` refuses anything else.
- `collectors_csv`: dcgm-exporter's collectors file (`DCGM field, Prometheus type, help`), written
  from the `dcgm-exporter` entry. dcgm-exporter collects only the fields its file lists, and the
  stock file the GPU Operator uses leaves out several the rules read (ECC volume counters, NVLink
  error counters, row-remap pending, power violation, the per-XID count): the Pulumi program deploys
  this file instead, so a rule and the deployed file cannot disagree.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from gpufleet.catalog.injection import ExporterInject
from gpufleet.catalog.model import Fault, Model
from gpufleet.catalog.promql import metric_names
from gpufleet.core.errors import Problem
from gpufleet.core.inputs import load_yaml_model

EXPORTERS_FILE = Path(__file__).parent / "exporters.yaml"
COLLECTORS_FILE = "monitoring/dcgm-exporter/dcgm-metrics.csv"
DCGM_EXPORTER = "dcgm-exporter"
RECORDING_PREFIX = "gpufleet:"  # recording rules of the catalog (level:metric:operations)


class Series(Model):
    type: Literal["gauge", "counter"]
    help: Annotated[str, Field(min_length=1)]
    unit: str | None = None
    field_id: Annotated[int, Field(ge=1)] | None = None  # DCGM field id (dcgm_fields.h)
    stock_default: bool | None = None  # in the stock collectors file of the pinned version
    extra_labels: list[str] = Field(default_factory=list)


class Owner(Model):
    """How an exporter names the workload that holds a device (ADR 0048): the labels gpufleet copies
    onto that device's alerts as `namespace` and `pod`, read from a series every device reports."""

    series: str  # present for every device while the exporter reports it
    keys: Annotated[list[str], Field(min_length=1)]  # the labels that identify one device
    namespace: str  # the scraped label holding the pod's namespace
    pod: str  # ... and the pod's name
    record: Annotated[str, Field(pattern=r"^gpufleet:[a-z0-9_]+:[a-z0-9_]+$")]


class Exporter(Model):
    vendor: str | None = None
    version: str
    deployed_by: str | None  # None: gpufleet does not deploy it; `setting` says what to run
    # The sandbox serves this exporter's series (its node agents speak dcgm-exporter's, node_exporter's
    # and ipmi_exporter's formats; its own Prometheus; the training job): an alert reading only
    # other exporters cannot fire there (catalog.detection.can_fire).
    sandbox: bool = False
    # The storage sandbox serves it (gpufleet.sandbox.storage.monitoring: Ceph's mgr prometheus
    # module, a blackbox probe of radosgw), on a sandbox stack with storage.ceph.
    storage_sandbox: bool = False
    source: str
    labels: list[str]
    optional_labels: list[str] = Field(default_factory=list)
    collectors_file: bool = False  # collects only what a file lists (dcgm-exporter)
    # How old a value can be when scraped (ADR 0044): `scrape` (read from the device when scraped),
    # `dcgmScrapeInterval` (the program sets the exporter's loop to the stack's key), a duration (its
    # own loop, cited), or `unknown` (not counted in a detection path, and said so).
    collection_interval: Annotated[
        str, Field(pattern=r"^(scrape|dcgmScrapeInterval|unknown|[0-9]+(ms|s|m))$")]
    setting: str
    series: dict[str, Series]
    owner: Owner | None = None

    @model_validator(mode="after")
    def _owner_from_own_series(self) -> Exporter:
        o = self.owner
        if o is None:
            return self
        if o.series not in self.series:
            raise ValueError(f"owner.series: {o.series} is not a series of this exporter")
        # `node` comes from the Pulumi program's relabelling (NODE_RELABELING), not the exporter.
        known = {"node", *self.labels}
        missing = [k for k in o.keys if k not in known]
        if missing:
            raise ValueError(f"owner.keys: {', '.join(missing)} not among the exporter's labels")
        return self


class Exporters(Model):
    exporters: dict[str, Exporter]

    @model_validator(mode="after")
    def _one_producer(self) -> Exporters:
        seen: dict[str, str] = {}
        for name, ex in self.exporters.items():
            for series in ex.series:
                if series in seen:
                    raise ValueError(
                        f"{series} is declared by both {seen[series]} and {name}: one producer each")
                seen[series] = name
        return self

    def producer(self, metric: str) -> tuple[str, Exporter] | None:
        for name, ex in self.exporters.items():
            if metric in ex.series:
                return name, ex
        return None


def load_exporters(path: Path = EXPORTERS_FILE) -> Exporters:
    return load_yaml_model(path, Exporters)


@dataclass(frozen=True)
class Reader:
    """Something that reads series: an alert, a recording rule or a dashboard panel."""

    where: str  # e.g. "alert GpuFallenOffBus" (the problem path)
    expr: str


def signal_problems(readers: Iterable[Reader], exporters: Exporters, recorded: set[str]) -> list[Problem]:
    """A problem per series read that no exporter declares, naming the reader and the series."""
    out = []
    for r in readers:
        try:
            names = metric_names(r.expr)
        except ValueError as e:
            out.append(Problem(r.where, str(e)))
            continue
        for name in sorted(names):
            if name.startswith(RECORDING_PREFIX):
                if name not in recorded:
                    out.append(Problem(r.where, f"reads {name}, which no recording rule records"))
            elif exporters.producer(name) is None:
                hint = (f"add it to the {DCGM_EXPORTER} entry (its field id and type) so the deployed "
                        "collectors file collects it") if name.startswith("DCGM_") else \
                       "declare the exporter and setting that produce it"
                out.append(Problem(r.where, f"reads {name}, which no exporter in exporters.yaml "
                                            f"produces: {hint}"))
    return out


def vendor_series_problems(faults: Iterable[Fault], exporters: Exporters) -> list[Problem]:
    """A problem per `exporter-inject` or `exporter-field` series that the exporter of the fault's
    own vendor does not declare (a series of another vendor, of no exporter, or a fault with no
    vendor): what is injected and checked is what that exporter really publishes."""
    out = []
    for f in faults:
        named: list[tuple[str, str]] = []
        inj = f.injection
        if isinstance(inj, ExporterInject):
            named.append(("injection.metric", inj.metric))
        if f.health_check is not None and f.health_check.metric is not None:
            named.append(("healthCheck.metric", f.health_check.metric))
        for where, metric in named:
            found = exporters.producer(metric)
            if f.vendor is None or f.vendor == "nvidia":
                out.append(Problem(f"{f.id}.{where}", "an exporter series is for an AMD or Huawei fault "
                                   "(`vendor`); NVIDIA's are DCGM fields (dcgm-inject, dcgm-field)"))
            elif found is None or found[1].vendor != f.vendor:
                out.append(Problem(f"{f.id}.{where}", f"{metric} is not a series of the {f.vendor} "
                                   "exporter in exporters.yaml"))
    return out


def series_sources(expr: str, exporters: Exporters, records: dict[str, str] | None = None,
                   ) -> list[tuple[str, str, str]]:
    """(series, exporter, setting) for every series `expr` reads, sorted by series; a recording
    rule of the catalog (`records`: name -> expression) is listed and followed to what it reads."""
    recs = records or {}
    out: dict[str, tuple[str, str, str]] = {}
    todo, seen = [expr], set()
    while todo:
        for name in metric_names(todo.pop()):
            if name in seen:
                continue
            seen.add(name)
            if name in recs:
                out[name] = (name, "Prometheus (recording rule of this catalog)", "the gpufleet rule file")
                todo.append(recs[name])
                continue
            found = exporters.producer(name)
            if found is not None:
                ex_name, ex = found
                setting = ex.setting
                if ex.series[name].stock_default is False:
                    setting += " (not in the stock file)"
                out[name] = (name, ex_name, setting)
    return [out[k] for k in sorted(out)]


def collectors_csv(exporters: Exporters) -> str:
    """dcgm-exporter's collectors file: one `field, type, help` line per declared series."""
    ex = exporters.exporters[DCGM_EXPORTER]
    lines = [
        "# Generated by `gpufleet generate` from gpufleet/catalog/exporters.yaml. Do not edit.",
        f"# dcgm-exporter {ex.version} collectors file (format: DCGM field, Prometheus type, help).",
        "# Deployed by the Pulumi program as the GPU Operator's dcgmExporter.config ConfigMap.",
    ]
    for name, s in ex.series.items():
        lines.append(f"{name}, {s.type}, {s.help.replace(',', ';')}")
    return "\n".join(lines) + "\n"


def collected_fields(csv_text: str) -> set[str]:
    """The fields a collectors file makes dcgm-exporter collect (comments and blanks skipped)."""
    out = set()
    for line in csv_text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.add(line.split(",", 1)[0].strip())
    return out
