"""Runbooks (`runbooks/<AlertName>.md`) and their index, rendered with jinja2 from the catalog, the
hand-written notes (`notes/runbooks.yaml`) and per-domain / per-action standard steps.

Sections follow prometheus-operator/runbooks' template: Meaning / Impact / Diagnosis / Mitigation.
"""

from __future__ import annotations

from pathlib import Path

import jinja2
from pydantic import BaseModel, ConfigDict, Field

from gpufleet.catalog.exporters import Exporters, load_exporters, series_sources
from gpufleet.catalog.injection import Capabilities
from gpufleet.catalog.load import Catalog
from gpufleet.catalog.model import Fault
from gpufleet.catalog.owners import alert_owner, owner_record
from gpufleet.catalog.rules import alert_rule, domain_of, recording_rules
from gpufleet.core.errors import InputError, Problem
from gpufleet.core.inputs import load_yaml_model
from gpufleet.core.node_health import NVIDIA_DEVICE_PLUGIN_SKIPPED_XIDS
from gpufleet.core.taxonomy import LadderAction

NOTES_FILE = Path(__file__).parent / "notes" / "runbooks.yaml"
RUNBOOKS_DIR = "runbooks"
SECTIONS = ("## Meaning", "## Impact", "## Diagnosis", "## Mitigation")


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Step(_M):
    run: str
    why: str


class FaultNotes(_M):
    impact: str
    diagnosis: list[Step] = Field(default_factory=list)
    mitigation: list[str] = Field(default_factory=list)
    # False when the standard steps of the fault's ladder action would be wrong advice for the
    # alert (a crash loop must not be restarted again).
    ladder_steps: bool = Field(default=True, alias="ladderSteps")


class Notes(_M):
    faults: dict[str, FaultNotes]


def load_notes(path: Path = NOTES_FILE) -> Notes:
    return load_yaml_model(path, Notes)


# Commands an on-call engineer runs first, per domain (real CLIs: nvidia-smi, dcgmi, ibstat,
# scontrol, kubectl). Placeholders in <angle brackets> come from the alert's labels.
_SCHEDULER = [
    Step(run="scontrol show node <node>", why="Slurm: node state, drain reason, running jobs"),
    Step(run="kubectl describe node <node>", why="Kubernetes: conditions, taints and the pods on the node"),
]
_DOMAIN_DIAGNOSIS: dict[str, list[Step]] = {
    "gpu": [
        Step(run="nvidia-smi -q -i <gpu>", why="state of the GPU named by the alert's `gpu` label"),
        Step(run="journalctl -k --since '-1 hour' | grep 'NVRM: Xid'", why="the XIDs the driver logged"),
        Step(run="dcgmi health -g 0 -s a && dcgmi health -g 0 -c",
             why="DCGM health watches (PASS / WARN / FAIL per subsystem)"),
        Step(run="dcgmi diag -r 2", why="active diagnostics (~2 minutes; only on a drained node)"),
    ],
    "node": [
        Step(run="ping -c 3 <node> && ssh <node> uptime", why="is the OS reachable, and since when is it up"),
        Step(run="ipmitool sel list | tail -n 20", why="hardware events the BMC logged"),
    ],
    "fabric": [
        Step(run="ibstat", why="InfiniBand port state (Active), physical state (LinkUp), rate"),
        Step(run="ibstatus", why="rate and width of every port at a glance"),
        Step(run="perfquery -x", why="port error counters (symbol errors, link downed, recovery)"),
    ],
    "storage": [
        Step(run="mount | grep -E 'juicefs|ceph'", why="which mounts the node has"),
        Step(run="ceph status", why="Ceph health when the store is Rook-Ceph"),
    ],
    "workload": [
        Step(run="squeue -j <jobid> -o '%i %T %M %N'", why="Slurm: state, run time and nodes of the job"),
        Step(run="sacct -j <jobid> --format=JobID,State,ExitCode,NodeList,Start,End",
             why="Slurm: exit codes of the job's steps"),
        Step(run="kubectl get pods -l <job selector> -o wide",
             why="Kubernetes: pods of the job and their nodes"),
    ],
}

_DRAIN = ("Take the node out of scheduling: `scontrol update nodename=<node> state=drain reason=\"{alert}\"` "
          "(Slurm) or `kubectl cordon <node> && kubectl drain <node> --ignore-daemonsets "
          "--delete-emptydir-data` (Kubernetes).")
_RESUME = ("Verify with `dcgmi diag -r 2`, then return the node: `scontrol update nodename=<node> "
           "state=resume` or `kubectl uncordon <node>`.")
# NVIDIA's device plugin marks a GPU Unhealthy on an XID it does not skip and never marks it Healthy
# again; only a restart of the plugin does (k8s-device-plugin issue #234, its maintainers' answer;
# v0.17.4, the newest the module proxy serves, still says so: internal/plugin/server.go, "FIXME: there
# is no way to recover from the Unhealthy state"). After a reset without a reboot the node's
# allocatable stays short: the steps of a fault at such an XID whose node is not rebooted say to restart it.
_PLUGIN_RESTART_HOW = (
    "delete the node's device plugin pod (`kubectl get pods -A -o wide --field-selector spec.nodeName=<node> "
    "| grep nvidia-device-plugin`), then check that the node's allocatable `nvidia.com/gpu` equals its "
    "capacity (`kubectl get node <node> -o jsonpath='{{.status.capacity.nvidia\\.com/gpu}} "
    "{{.status.allocatable.nvidia\\.com/gpu}}'`).")
_NVIDIA_PLUGIN_RESTART = (
    "Kubernetes: NVIDIA's device plugin keeps a GPU it marked Unhealthy out of the node's allocatable "
    "until the plugin restarts, reset or not. After the reset, " + _PLUGIN_RESTART_HOW)
_NVIDIA_PLUGIN_KEEPS = (
    "Kubernetes: at this XID NVIDIA's device plugin marked the GPU Unhealthy, and it keeps it out of the "
    "node's allocatable until the plugin restarts, though the node stays in service: a job that asks "
    "for every GPU of the node cannot land there. Once the GPU is fine, " + _PLUGIN_RESTART_HOW)
_ACTION_STEPS: dict[LadderAction, list[str]] = {
    LadderAction.NONE: [
        "No automatic remediation: the alert informs. Do not cordon or drain the node for this alert alone.",
    ],
    LadderAction.RESTART_JOB: [
        "Restart the affected job from its last checkpoint: `scontrol requeue <jobid>` (Slurm) or delete "
        "its failed pods and let the Volcano/Kueue job policy restart it (Kubernetes). The node stays "
        "in service.",
    ],
    LadderAction.RESET_GPU: [
        _DRAIN,
        "Reset the GPU once no process uses it: `gpufleet gpu-reset <pci>` runs `nvidia-smi -r -i <pci>` "
        "and records the reset in the kernel log, so the health checks stop counting the XIDs before it "
        "(on NVSwitch systems all GPUs of the node reset together).",
        _RESUME,
    ],
    LadderAction.REBOOT_NODE: [
        _DRAIN,
        "Reboot the node; power-cycle it through the BMC if it does not come back "
        "(`ipmitool -H <bmc> chassis power cycle`).",
        _RESUME,
    ],
    LadderAction.REPLACE: [
        _DRAIN,
        "Open a hardware ticket (RMA) with the evidence above, and bring a spare node into the pool.",
    ],
}


# Other vendors' accelerators: their own tools replace nvidia-smi / dcgmi (AMD: rocm-smi and amd-smi
# of ROCm; Huawei Ascend: npu-smi and hccn_tool of the Ascend driver).
_VENDOR_DIAGNOSIS: dict[str, list[Step]] = {
    "amd": [
        Step(run="amd-smi list", why="the GPUs the driver enumerates (compare with the node's peers)"),
        Step(run="rocm-smi --showrasinfo all", why="RAS (ECC) error counts per block"),
        Step(run="journalctl -k --since '-1 hour' | grep -i amdgpu", why="what the amdgpu driver logged"),
    ],
    "huawei": [
        Step(run="npu-smi info", why="every NPU's health and the chip error codes"),
        Step(run="npu-smi info -t health -i <id>",
             why="the health and error code of the NPU named by the alert's `id`"),
        Step(run="hccn_tool -i <id> -link -g", why="the NPU's RoCE port link state"),
    ],
}
_VENDOR_RESET: dict[str, str] = {
    "amd": "Reset the GPU once no process uses it: `rocm-smi --gpureset -d <gpu_id>`.",
    "huawei": "Reset the NPU once no process uses it: `npu-smi set -t reset -i <id> -c 0`.",
}
_VENDOR_VERIFY: dict[str, str] = {
    "amd": "Verify with the ROCm validation suite (`rvs`) and `amd-smi list`, then return the node: "
           "`scontrol update nodename=<node> state=resume` or `kubectl uncordon <node>`.",
    "huawei": "Verify that `npu-smi info` shows the NPU healthy, then return the node: "
              "`scontrol update nodename=<node> state=resume` or `kubectl uncordon <node>`.",
}


def diagnosis_steps(fault: Fault, domain: str, notes: FaultNotes) -> list[Step]:
    scheduler = [] if domain in ("storage", "workload") else _SCHEDULER
    own = _DOMAIN_DIAGNOSIS.get(domain, [])
    if fault.vendor in _VENDOR_DIAGNOSIS:
        own = _VENDOR_DIAGNOSIS[fault.vendor]  # its own tools, for its chips and its ports
    return [*notes.diagnosis, *own, *scheduler]


def _ladder(fault: Fault) -> list[str]:
    """The standard steps of the fault's action, in its vendor's tools."""
    steps = list(_ACTION_STEPS[fault.action])
    # NVIDIA's device plugin marks the GPU Unhealthy at this fault's XID (_PLUGIN_RESTART_HOW's note);
    # a reboot restarts the plugin with the node, a replacement takes the node away.
    if (fault.vendor not in _VENDOR_RESET and fault.xid is not None
            and fault.xid not in NVIDIA_DEVICE_PLUGIN_SKIPPED_XIDS):
        if fault.action is LadderAction.RESET_GPU:
            steps.insert(steps.index(_RESUME), _NVIDIA_PLUGIN_RESTART)  # before the node returns
        elif fault.action in (LadderAction.NONE, LadderAction.RESTART_JOB):
            steps.append(_NVIDIA_PLUGIN_KEEPS)
    if fault.vendor in _VENDOR_RESET:
        vendor = fault.vendor
        steps = [_VENDOR_RESET[vendor] if s.startswith("Reset the GPU") else
                 _VENDOR_VERIFY[vendor] if s == _RESUME else s for s in steps]
    return steps


def rehearsal_step(fault: Fault, capabilities: Capabilities) -> str | None:
    """Which backends can inject the fault and how (the override for a backend, else the common
    injection), from the backends' declared capabilities."""
    if fault.injection is None:
        return None
    can, cannot = [], []
    for backend in sorted(capabilities):
        inj = fault.injection_for(backend)
        if inj is not None and type(inj) in capabilities[backend]:
            can.append(f"{backend} (`{inj.describe()}`)")
        else:
            cannot.append(backend)
    if not can:
        return (f"No backend can inject it yet (`{fault.injection.describe()}`: not among the declared "
                "capabilities of " + ", ".join(cannot) + ").")
    return ("Rehearse it with a chaos experiment; injection per backend: " + ", ".join(can)
            + (f"; not offered by {', '.join(cannot)}" if cannot else "") + ".")


def mitigation_steps(fault: Fault, notes: FaultNotes, capabilities: Capabilities) -> list[str]:
    assert fault.alert is not None
    ladder = _ladder(fault) if notes.ladder_steps else []
    steps = [*notes.mitigation, *(s.format(alert=fault.alert.name) for s in ladder)]
    if fault.escalation:
        e = fault.escalation
        steps.append(f"If it happens {e.repeats} times within {e.window_hours:g} hours on the same GPU or "
                     f"node, escalate to `{e.to.value}` instead of `{fault.action.value}`.")
    if fault.dedup:
        d = fault.dedup
        line = f"Repeats within {d.window_seconds:g} s on the same GPU/node count as one event."
        if d.secondary_to:
            refs = ", ".join("any other XID" if r == "any" else f"`{r}`" for r in d.secondary_to)
            line += f" When {refs} was seen on the node in that window, act on that fault, not on this one."
        steps.append(line)
    rehearsal = rehearsal_step(fault, capabilities)
    if rehearsal:
        steps.append(rehearsal)
    return steps


def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        autoescape=False,  # Markdown, not HTML
    )


def render_runbook(fault: Fault, domain: str, notes: FaultNotes, capabilities: Capabilities,
                   exporters: Exporters | None = None, catalog_records: dict[str, str] | None = None,
                   ) -> str:
    """`catalog_records`: every recording rule of the catalog (name -> expression), so the table of
    sources follows a recorded series to the exporter series it is computed from."""
    if fault.alert is None:
        raise ValueError(f"fault {fault.id} has no alert, so no runbook")
    rule = alert_rule(fault)
    records = recording_rules(fault)
    ex = exporters if exporters is not None else load_exporters()
    exprs = "\n".join([str(rule["expr"]), *(str(r["expr"]) for r in records)])
    records_by_name = {**(catalog_records or {}), **{str(r["record"]): str(r["expr"]) for r in records}}
    # The owner join (ADR 0048) adds labels, not a reason to fire: the expression shown is the
    # catalog's, and the owner's record and series are named beside it.
    owner = alert_owner(fault.alert.expr, ex, records_by_name)
    if owner is not None:
        rec = owner_record(owner)
        records_by_name[rec["record"]] = rec["expr"]
        exprs += f"\n{rec['record']}"
    rate_text = ""
    if fault.rate:
        r = fault.rate
        unit = ("per million GPU-hours" if r.per_million_gpu_hours is not None
                else "per thousand node-days")
        value = r.per_million_gpu_hours if r.per_million_gpu_hours is not None else r.per_thousand_node_days
        share = f", {r.share:.0%} of it attributed to this fault" if r.share < 1 else ""
        rate_text = f"{value:g} {unit} for \"{r.cause}\"{share}"
    text = _env().get_template("runbook.md.j2").render(
        fault=fault, alert=fault.alert, domain=domain, notes=notes, rate_text=rate_text,
        rule=rule, records=records, sources=series_sources(exprs, ex, records_by_name), owner=owner,
        diagnosis=diagnosis_steps(fault, domain, notes),
        mitigation=mitigation_steps(fault, notes, capabilities),
    )
    return text.rstrip("\n") + "\n"


def missing_notes(catalog: Catalog, notes: Notes) -> tuple[list[str], list[str]]:
    """(alerting faults without notes, notes for no alerting fault)."""
    alerting = {f.id for f in catalog if f.alert is not None}
    return sorted(alerting - set(notes.faults)), sorted(set(notes.faults) - alerting)


def runbook_files(catalog: Catalog, notes: Notes, capabilities: Capabilities,
                  exporters: Exporters | None = None) -> dict[str, str]:
    """`runbooks/<AlertName>.md` for every alert plus `runbooks/README.md`, keyed by relative path."""
    no_notes, orphans = missing_notes(catalog, notes)
    problems = [Problem(f"faults.{i}", "no runbook notes for this alerting fault") for i in no_notes]
    problems += [Problem(f"faults.{i}", "notes for a fault without an alert") for i in orphans]
    if problems:
        raise InputError(str(NOTES_FILE), problems)
    out: dict[str, str] = {}
    records = {str(r["record"]): str(r["expr"]) for f in catalog for r in recording_rules(f)}
    for f in catalog:
        if f.alert is not None:
            out[f"{RUNBOOKS_DIR}/{f.alert.name}.md"] = render_runbook(
                f, domain_of(f, catalog), notes.faults[f.id], capabilities, exporters, records)
    out[f"{RUNBOOKS_DIR}/README.md"] = index(catalog)
    return out


def index(catalog: Catalog) -> str:
    lines = [
        "<!-- Generated by `gpufleet generate` from gpufleet/catalog. Do not edit. -->",
        "# Runbooks",
        "",
        "One runbook per alert of the fault catalog (Meaning / Impact / Diagnosis / Mitigation). The alert's",
        "`runbook_url` annotation links here. How the rules read dcgm-exporter's XID gauge:",
        "[docs/alerts.md](../docs/alerts.md).",
        "",
        "| Alert | Severity | Fault | Class | Action |",
        "|---|---|---|---|---|",
    ]
    alerting = [f for f in catalog if f.alert is not None]
    for f in sorted(alerting, key=lambda f: (domain_of(f, catalog), f.alert.name if f.alert else "")):
        assert f.alert is not None
        lines.append(f"| [{f.alert.name}]({f.alert.name}.md) | {f.severity.value} | `{f.id}` - {f.title} "
                     f"| `{f.fault_class.value}` | `{f.action.value}` |")
    exempt = [f for f in catalog if f.alert is None]
    if exempt:
        lines += ["", "## Faults without an alert", "",
                  "These faults have no alert of their own; the exemption says how they are detected.", "",
                  "| Fault | Class | How it is detected |", "|---|---|---|"]
        lines += [f"| `{f.id}` - {f.title} | `{f.fault_class.value}` | {f.exemption} |" for f in exempt]
    return "\n".join(lines) + "\n"
