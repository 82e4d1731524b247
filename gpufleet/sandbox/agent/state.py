"""The agent's GPU state and its transitions (pure): injections as `dcgmi test --inject` does them,
clears as a GPU reset / node reboot does them, and the documents written from it.

`dcgmi test --inject --gpuid <id> -f <fieldId> -v <value>` writes the value into DCGM's field cache:
the field READS the injected value from then on (counters included: the value is set, not added).
Field 230 (XID) additionally counts one event per XID like newer dcgm-exporters'
DCGM_EXP_XID_ERRORS_COUNT{xid}, and the gauge keeps the last XID until a reset (dcgm-exporter #190).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpufleet.catalog import Catalog, XidRule
from gpufleet.sandbox.agent import fields as F
from gpufleet.sandbox.agent.policy import GpuFault, classify_field, classify_metric, classify_xid, worse
from gpufleet.sandbox.agent.vendors import VendorFormat

MAX_EVENTS = 1000  # XID events kept for /state (bounded memory and state file)
MAX_BURST = 1000


@dataclass(frozen=True)
class Injection:
    gpu: int
    field_id: int
    value: float
    kmsg: bool = False
    burst: int = 1  # number of identical events (an XID 45 storm is many lines, one per event)


@dataclass(frozen=True)
class MetricInjection:
    """A value written into one GPU's series of its vendor's exporter (vendors.py)."""

    gpu: int
    metric: str
    value: float


@dataclass(frozen=True)
class XidEvent:
    gpu: int
    xid: int
    at: float


@dataclass(frozen=True)
class GpuState:
    index: int
    fields: dict[int, float] = field(default_factory=dict)  # injected values (override baseline)
    metrics: dict[str, float] = field(default_factory=dict)  # injected vendor-exporter series
    xid_counts: dict[int, int] = field(default_factory=dict)
    fault: GpuFault | None = None
    fault_since: float | None = None
    reset_at: float | None = None  # last /clear of this GPU (GPU reset or node reboot)
    # A hang (POST /hang): the GPU stops completing work with no XID and no DCGM health change, so
    # nothing the exporter publishes shows it; a process on it blocks until a GPU reset (/clear).
    hung_since: float | None = None


@dataclass(frozen=True)
class AgentState:
    node: str
    gpus: tuple[GpuState, ...]
    events: tuple[XidEvent, ...] = ()
    started_at: float = 0.0


def initial_state(node: str, gpus: int, now: float) -> AgentState:
    return AgentState(node, tuple(GpuState(i) for i in range(gpus)), (), now)


def parse_injection(body: Any, gpus: int, fmt: VendorFormat | None = None) -> Injection | MetricInjection:
    """Validate a POST /inject body (a DCGM field on an NVIDIA node, a series of its vendor's
    exporter on another: `fmt`); raises ValueError naming what is wrong."""
    if not isinstance(body, dict):
        raise ValueError("body must be a JSON object")
    if "metric" in body:
        return _parse_metric_injection(body, gpus, fmt)
    if fmt is not None:
        raise ValueError(f"this node's GPUs are {fmt.vendor.value}'s: they have no DCGM fields; "
                         f"inject a series of {fmt.exporter} (metric, value)")
    unknown = sorted(set(body) - {"gpu", "field_id", "value", "kmsg", "burst"})
    if unknown:
        raise ValueError(f"unknown keys: {', '.join(unknown)}")
    gpu, fid, value = body.get("gpu"), body.get("field_id"), body.get("value")
    kmsg, burst = body.get("kmsg", False), body.get("burst", 1)
    if not isinstance(gpu, int) or isinstance(gpu, bool) or not 0 <= gpu < gpus:
        raise ValueError(f"gpu must be an integer 0..{gpus - 1}")
    if not isinstance(fid, int) or isinstance(fid, bool):
        raise ValueError("field_id must be an integer DCGM field id")
    F.field_spec(fid)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ValueError("value must be a number")
    if not isinstance(kmsg, bool):
        raise ValueError("kmsg must be true or false")
    if not isinstance(burst, int) or isinstance(burst, bool) or not 1 <= burst <= MAX_BURST:
        raise ValueError(f"burst must be an integer 1..{MAX_BURST}")
    if fid == F.XID_ERRORS and (value != int(value) or not 0 <= value <= 255):
        raise ValueError("an XID (field 230) is an integer 0..255")
    if kmsg and fid != F.XID_ERRORS:
        raise ValueError("kmsg lines exist for XIDs only (field 230)")
    return Injection(gpu, fid, float(value), kmsg, burst)


def _parse_metric_injection(body: dict[str, Any], gpus: int, fmt: VendorFormat | None) -> MetricInjection:
    unknown = sorted(set(body) - {"gpu", "metric", "value"})
    if unknown:
        raise ValueError(f"unknown keys: {', '.join(unknown)}")
    if fmt is None:
        raise ValueError("this node's GPUs are NVIDIA's: inject a DCGM field (field_id, value), not a metric")
    gpu, metric, value = body.get("gpu"), body.get("metric"), body.get("value")
    if not isinstance(gpu, int) or isinstance(gpu, bool) or not 0 <= gpu < gpus:
        raise ValueError(f"gpu must be an integer 0..{gpus - 1}")
    if not isinstance(metric, str):
        raise ValueError("metric must be a series name")
    if not fmt.spec(metric).injectable:
        raise ValueError(f"{metric} reports the fabric link's state: take the link down instead")
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ValueError("value must be a number")
    return MetricInjection(gpu, metric, float(value))


def inject(
    state: AgentState, inj: Injection | MetricInjection, catalog: Catalog, rules: Mapping[int, XidRule],
    now: float,
) -> tuple[AgentState, list[XidEvent]]:
    """Apply one injection; returns the new state and the XID events it produced."""
    g = state.gpus[inj.gpu]
    if isinstance(inj, MetricInjection):
        found = classify_metric(inj.metric, inj.value, catalog)
        ng = _holding(replace(g, metrics={**g.metrics, inj.metric: inj.value}), found, now)
        return replace(state, gpus=tuple(ng if x.index == inj.gpu else x for x in state.gpus)), []
    fields_ = {**g.fields, inj.field_id: inj.value}
    counts = dict(g.xid_counts)
    new_events: list[XidEvent] = []
    fault: GpuFault | None
    if inj.field_id == F.XID_ERRORS and inj.value > 0:
        xid = int(inj.value)
        counts[xid] = counts.get(xid, 0) + inj.burst
        new_events = [XidEvent(inj.gpu, xid, now) for _ in range(inj.burst)]
        fault = classify_xid(xid, catalog, rules)
    else:
        fault = classify_field(inj.field_id, inj.value, catalog)
    ng = _holding(replace(g, fields=fields_, xid_counts=counts), fault, now)
    gpus = tuple(ng if x.index == inj.gpu else x for x in state.gpus)
    events = (state.events + tuple(new_events))[-MAX_EVENTS:]
    return replace(state, gpus=gpus, events=events), new_events


def parse_hang(body: Any, gpus: int) -> int:
    """Validate a POST /hang body {"gpu": <int>}; raises ValueError naming what is wrong."""
    if not isinstance(body, dict) or set(body) - {"gpu"}:
        raise ValueError('body must be {"gpu": <int>}')
    gpu = body.get("gpu")
    if not isinstance(gpu, int) or isinstance(gpu, bool) or not 0 <= gpu < gpus:
        raise ValueError(f"gpu must be an integer 0..{gpus - 1}")
    return gpu


def hang(state: AgentState, gpu: int, now: float) -> AgentState:
    """GPU `gpu` stops completing work (already hung: unchanged, since when it first hung)."""
    gpus = tuple(replace(x, hung_since=now) if x.index == gpu and x.hung_since is None else x
                 for x in state.gpus)
    return replace(state, gpus=gpus)


def _holding(g: GpuState, fault: GpuFault | None, now: float) -> GpuState:
    """The GPU with the fault it holds after `fault` arrives (policy.worse), since when."""
    kept = worse(g.fault, fault)
    since = g.fault_since if kept is g.fault else (now if kept is not None else None)
    return replace(g, fault=kept, fault_since=since)


def clear(state: AgentState, gpu: int | None, now: float) -> AgentState:
    """A GPU reset (one GPU) or node reboot (gpu None): injected values, counts and faults go."""
    gpus = tuple(GpuState(x.index, reset_at=now) if gpu is None or x.index == gpu else x for x in state.gpus)
    events = tuple(e for e in state.events if gpu is not None and e.gpu != gpu)
    return replace(state, gpus=gpus, events=events)


# --------------------------------------------------------------------------- documents


def health_doc(state: AgentState) -> dict[str, Any]:
    """<state-dir>/gpu-health.json: what the training ranks read every step."""
    out: dict[str, Any] = {}
    for g in state.gpus:
        entry: dict[str, Any] = {}
        if g.fault is not None:
            entry = {
                "fatal": g.fault.fatal,
                "kills_process": g.fault.kills_process,
                "xid": g.fault.xid,
                "fault_id": g.fault.fault_id,
                "since": g.fault_since,
                "error": g.fault.error,
            }
        if g.hung_since is not None:
            entry["hung_since"] = g.hung_since
        if entry:
            out[str(g.index)] = entry
    return {"node": state.node, "gpus": out}


def to_json(state: AgentState) -> dict[str, Any]:
    """Persisted form (and the body of GET /state)."""
    return {
        "node": state.node,
        "started_at": state.started_at,
        "gpus": [
            {
                "index": g.index,
                "fields": {str(k): v for k, v in sorted(g.fields.items())},
                "metrics": dict(sorted(g.metrics.items())),
                "xid_counts": {str(k): v for k, v in sorted(g.xid_counts.items())},
                "fault": None if g.fault is None else {
                    "fatal": g.fault.fatal, "fault_id": g.fault.fault_id, "xid": g.fault.xid,
                    "title": g.fault.title, "error": g.fault.error, "since": g.fault_since,
                    "kills_process": g.fault.kills_process,
                },
                "reset_at": g.reset_at,
                "hung_since": g.hung_since,
            }
            for g in state.gpus
        ],
        "events": [{"gpu": e.gpu, "xid": e.xid, "at": e.at} for e in state.events],
    }


def from_json(doc: dict[str, Any], node: str, gpus: int, now: float) -> AgentState:
    """Restore a persisted state. A state of another node is rejected; a different GPU count keeps
    the GPUs both have (the node was reconfigured)."""
    if doc.get("node") != node:
        raise ValueError(f"state file belongs to node {doc.get('node')!r}, not {node!r}")
    by_index = {int(g["index"]): g for g in doc.get("gpus", [])}
    out = []
    for i in range(gpus):
        g = by_index.get(i)
        if g is None:
            out.append(GpuState(i))
            continue
        f = g.get("fault")
        fault = None if f is None else GpuFault(
            bool(f["fatal"]), f.get("fault_id"), f.get("xid"), str(f["title"]), str(f["error"]),
            bool(f.get("kills_process", f["fatal"])),
        )
        out.append(GpuState(
            i,
            fields={int(k): float(v) for k, v in g.get("fields", {}).items()},
            metrics={str(k): float(v) for k, v in g.get("metrics", {}).items()},
            xid_counts={int(k): int(v) for k, v in g.get("xid_counts", {}).items()},
            fault=fault,
            fault_since=None if f is None else f.get("since"),
            reset_at=g.get("reset_at"),
            hung_since=g.get("hung_since"),
        ))
    events = tuple(
        XidEvent(int(e["gpu"]), int(e["xid"]), float(e["at"]))
        for e in doc.get("events", []) if int(e["gpu"]) < gpus
    )
    return AgentState(node, tuple(out), events[-MAX_EVENTS:], float(doc.get("started_at", now)))


def write_json_atomic(path: Path, doc: dict[str, Any]) -> None:
    """Write, fsync, rename: readers see the old or the new document, never a partial one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
