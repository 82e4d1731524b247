"""Host (non-GPU) signals of a sandbox node: BMC sensors, EDAC, the local filesystem, fabric port
error counters. Pure: the injected values in, metric families and the health check's view out.

The names and labels are the stock exporters' (ipmi_exporter's `ipmi_sensor_state` with 0 nominal,
1 warning, 2 critical; node_exporter's edac, filesystem and infiniband collectors), so the catalog's
alert expressions read them unchanged. The signal names are the catalog's HOST_SIGNALS.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpufleet.catalog.model import HOST_SIGNALS

# The sensors a two-socket GPU server's BMC reports (two PSUs in a redundant pair, two CPUs); an
# injected value goes to the first of each type.
SENSORS = {"psu-state": ("Power Supply", ("PSU1", "PSU2")), "cpu-state": ("Processor", ("CPU0", "CPU1"))}
LOCAL_FS = ("/dev/nvme0n1p1", "ext4", "/local")  # device, fstype, mountpoint of the node's scratch disk
EFFECTS = ("crash", "sigbus")


@dataclass(frozen=True)
class HostInjection:
    signal: str
    value: float | None  # set the signal to this
    add: float | None  # or add this to it (counters)
    kill_processes: bool  # SIGBUS the training ranks on the node (memory_failure() on a UE)


def parse_host_injection(body: Any) -> HostInjection:
    """`{"signal", "value"? | "add"?, "kill_processes"?}`; raises ValueError naming what is wrong."""
    if not isinstance(body, dict):
        raise ValueError("body must be a JSON object")
    unknown = set(body) - {"signal", "value", "add", "kill_processes"}
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)}")
    signal = body.get("signal")
    if signal not in HOST_SIGNALS:
        raise ValueError(f"signal must be one of {sorted(HOST_SIGNALS)}")
    value, add = body.get("value"), body.get("add")
    if (value is None) == (add is None):
        raise ValueError("give exactly one of value and add")
    for name, v in (("value", value), ("add", add)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or v < 0):
            raise ValueError(f"{name} must be a number >= 0")
    kill = body.get("kill_processes", False)
    if not isinstance(kill, bool):
        raise ValueError("kill_processes must be true or false")
    return HostInjection(signal, None if value is None else float(value),
                         None if add is None else float(add), kill)


def apply(values: Mapping[str, float], inj: HostInjection) -> dict[str, float]:
    out = dict(values)
    if inj.value is not None:
        out[inj.signal] = inj.value
    else:
        out[inj.signal] = out.get(inj.signal, 0.0) + float(inj.add or 0.0)
    return out


def load(path: Path) -> dict[str, float]:
    """The persisted host values (a node reboot keeps a failed PSU failed); {} when none."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict):
        return {}
    return {k: float(v) for k, v in doc.items() if k in HOST_SIGNALS and isinstance(v, int | float)}


def families(values: Mapping[str, float], fabric_ifnames: list[str]) -> list[Metric]:
    sensor = GaugeMetricFamily("ipmi_sensor_state", "Indicated state of the sensor (0=nominal, 1=warning, "
                               "2=critical).", labels=["id", "name", "type"])
    n = 0
    for signal, (kind, names) in SENSORS.items():
        for i, name in enumerate(names):
            n += 1
            sensor.add_metric([str(n), name, kind], values.get(signal, 0.0) if i == 0 else 0.0)
    ue = CounterMetricFamily("node_edac_uncorrectable_errors", "Total uncorrectable errors.",
                             labels=["controller"])
    ue.add_metric(["0"], values.get("edac-ue", 0.0))
    ro = GaugeMetricFamily("node_filesystem_readonly", "Filesystem read-only status.",
                           labels=["device", "fstype", "mountpoint"])
    ro.add_metric(list(LOCAL_FS), values.get("fs-readonly", 0.0))
    sym = CounterMetricFamily("node_infiniband_symbol_error", "Number of minor link errors detected on "
                              "one or more physical lanes.", labels=["device", "port"])
    rec = CounterMetricFamily("node_infiniband_link_error_recovery", "Number of times the link "
                              "successfully recovered from an error state.", labels=["device", "port"])
    for i, ifname in enumerate(fabric_ifnames):
        sym.add_metric([ifname, "1"], values.get("symbol-errors", 0.0) if i == 0 else 0.0)
        rec.add_metric([ifname, "1"], 0.0)
    return [sensor, ue, ro, sym, rec]
