"""The running agent: holds the state behind a lock, persists it, and writes the files other
processes read (gpu-health.json for training ranks, the kernel log for log-based monitors).

Files under --state-dir:
  agent-state.json   injected state (survives an agent restart)
  gpu-health.json    {"node", "gpus": {"<i>": {"fatal", "xid", "fault_id", "since", "error"}}}
  procs/gpu<i>.json  written by a training rank using GPU i: {"pid", "name"} (busy GPU, kmsg pid)
  host-state.json    injected host signals (host.py): a failed PSU stays failed across a reboot
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpufleet.catalog import Catalog, XidRule, xid_policy
from gpufleet.core.sandbox_contract import AGENT_HEALTH_FILE
from gpufleet.sandbox.agent import fields as F
from gpufleet.sandbox.agent import host, kmsg
from gpufleet.sandbox.agent.exposition import Snapshot, vendor_values
from gpufleet.sandbox.agent.fabric import SYS_CLASS_NET, port_rate_bytes, read_link, read_shaped_rate
from gpufleet.sandbox.agent.state import (
    AgentState,
    Injection,
    MetricInjection,
    clear,
    from_json,
    hang,
    health_doc,
    initial_state,
    inject,
    to_json,
    write_json_atomic,
)
from gpufleet.sandbox.agent.vendors import VendorFormat

log = logging.getLogger("gpufleet.sandbox.agent")

STATE_FILE = "agent-state.json"
PROCS_DIR = "procs"
HOST_FILE = "host-state.json"


@dataclasses.dataclass(frozen=True)
class Versions:
    """What the node runs (None: not pinned) and the versions its fake GPUs fail to load under."""

    driver: str | None = None
    firmware: str | None = None
    bad: frozenset[str] = frozenset()

    def error(self) -> str | None:
        """The load error a bad version shows (what a real node's nvidia-smi would fail with)."""
        for what, v in (("driver", self.driver), ("firmware", self.firmware)):
            if v is not None and v in self.bad:
                return f"{what} {v} failed to initialize the GPUs"
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Agent:
    def __init__(
        self,
        *,
        node: str,
        gpus: int,
        model_name: str,
        state_dir: Path,
        kernel_log: Path,
        fabric_ifnames: Sequence[str],
        catalog: Catalog,
        xid_rules: Mapping[int, XidRule] | None = None,
        clock: Callable[[], float] = time.time,
        sys_class_net: Path = SYS_CLASS_NET,
        link_speed_gbps: float | None = None,
        vendor: VendorFormat | None = None,
        versions: Versions = Versions(),
    ) -> None:
        self.versions = versions
        self.node, self.gpus, self.model_name = node, gpus, model_name
        self.vendor = vendor  # None: NVIDIA (dcgm-exporter's format); else the vendor's exporter
        self.state_dir, self.kernel_log = state_dir, kernel_log
        self.fabric_ifnames = list(fabric_ifnames)
        self.link_speed_gbps = link_speed_gbps
        self.catalog, self.clock, self.sys_class_net = catalog, clock, sys_class_net
        # The stack's XID policy (catalog + remediation.xidOverrides); without a stack, the catalog's.
        self.xid_rules = dict(xid_rules) if xid_rules is not None else xid_policy(catalog, {})[0]
        self._lock = threading.Lock()
        state_dir.mkdir(parents=True, exist_ok=True)
        (state_dir / PROCS_DIR).mkdir(exist_ok=True)
        kernel_log.parent.mkdir(parents=True, exist_ok=True)
        kernel_log.touch(exist_ok=True)
        self.state = self._load()
        self.host = host.load(state_dir / HOST_FILE)
        self._persist()

    def _load(self) -> AgentState:
        path = self.state_dir / STATE_FILE
        now = self.clock()
        if path.exists():
            try:
                state = from_json(json.loads(path.read_text()), self.node, self.gpus, now)
                log.info("restored injected state from %s", path)
                return state
            except (ValueError, KeyError, TypeError) as e:
                # A corrupt state file must not keep the agent down; the old file is kept for inspection.
                bad = path.with_name(f"{path.name}.corrupt-{int(now)}")
                os.replace(path, bad)
                log.error("state file %s unreadable (%s); moved to %s, starting clean", path, e, bad)
        return initial_state(self.node, self.gpus, now)

    def _persist(self) -> None:
        write_json_atomic(self.state_dir / STATE_FILE, to_json(self.state))
        write_json_atomic(self.state_dir / AGENT_HEALTH_FILE, health_doc(self.state))

    # ----------------------------------------------------------------- operations

    def proc_of(self, gpu: int) -> tuple[int, str] | None:
        """The live training rank registered on a GPU, if any."""
        try:
            doc = json.loads((self.state_dir / PROCS_DIR / f"gpu{gpu}.json").read_text())
            pid, name = int(doc["pid"]), str(doc.get("name", "python"))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return (pid, name) if _pid_alive(pid) else None

    def inject(self, inj: Injection | MetricInjection) -> dict[str, Any]:
        with self._lock:
            now = self.clock()
            self.state, events = inject(self.state, inj, self.catalog, self.xid_rules, now)
            if isinstance(inj, Injection) and inj.kmsg and events:
                proc = self.proc_of(inj.gpu)
                fault = self.catalog.by_xid().get(events[0].xid)
                text = (fault.title if fault else f"Xid {events[0].xid}") + "."
                up = kmsg.system_uptime()
                kmsg.append_lines(self.kernel_log, [
                    kmsg.xid_line(host=self.node, at=e.at, uptime=up, pci=F.pci_bus_id(e.gpu), xid=e.xid,
                                  pid=proc[0] if proc else None, proc=proc[1] if proc else None, text=text)
                    for e in events
                ])
            self._persist()
            g = self.state.gpus[inj.gpu]
            log.info("inject gpu=%d %s -> fault=%s", inj.gpu, inj, g.fault)
            return {"gpu": inj.gpu, "fatal": bool(g.fault and g.fault.fatal),
                    "fault_id": g.fault.fault_id if g.fault else None, "events": len(events)}

    def inject_host(self, inj: host.HostInjection) -> dict[str, Any]:
        with self._lock:
            self.host = host.apply(self.host, inj)
            write_json_atomic(self.state_dir / HOST_FILE, dict(self.host))
            killed = self._kill_ranks(signal.SIGBUS) if inj.kill_processes else []
            log.info("host %s -> %g; killed %s", inj.signal, self.host[inj.signal], killed or "nothing")
            return {"signal": inj.signal, "value": self.host[inj.signal], "killed": killed}

    def clear_host(self) -> dict[str, Any]:
        """The node was repaired (PSU, DIMM, disk replaced; counters reset by the reboot)."""
        with self._lock:
            self.host = {}
            write_json_atomic(self.state_dir / HOST_FILE, {})
            log.info("host signals cleared")
            return {"cleared": "host"}

    def _kill_ranks(self, sig: int) -> list[int]:
        """Signal every live training rank registered on this node's GPUs."""
        pids = sorted({p[0] for g in range(self.gpus) if (p := self.proc_of(g)) is not None})
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return pids

    def hang(self, gpu: int) -> dict[str, Any]:
        with self._lock:
            self.state = hang(self.state, gpu, self.clock())
            self._persist()
            log.info("hang gpu=%d", gpu)
            return {"gpu": gpu, "hung_since": self.state.gpus[gpu].hung_since}

    def clear(self, gpu: int | None) -> dict[str, Any]:
        with self._lock:
            now = self.clock()
            self.state = clear(self.state, gpu, now)
            # As `gpufleet gpu-reset` on a real node: the reset's mark in the kernel log, so that a
            # reader of the log alone (node-health, `inspect --here`) dates the reset too.
            kmsg.append_lines(self.kernel_log, [
                kmsg.reset_line(host=self.node, at=now, pci=F.pci_bus_id(i))
                for i in range(self.gpus) if gpu is None or i == gpu
            ])
            self._persist()
            log.info("clear gpu=%s", "all" if gpu is None else gpu)
            return {"cleared": "all" if gpu is None else gpu}

    def snapshot(self) -> Snapshot:
        with self._lock:
            state = self.state
        busy = frozenset(i for i in range(self.gpus) if self.proc_of(i) is not None)
        links = [read_link(n, self.sys_class_net) for n in self.fabric_ifnames]
        if self.link_speed_gbps is not None:
            links = [
                dataclasses.replace(link, shaped_rate=read_shaped_rate(link.ifname)) if link.present else link
                for link in links
            ]
        return Snapshot(state, self.model_name, busy, links, self.link_speed_gbps, dict(self.host),
                        self.vendor)

    def state_doc(self) -> dict[str, Any]:
        snap = self.snapshot()
        doc = to_json(snap.state)
        for g in doc["gpus"]:
            g["uuid"] = F.gpu_uuid(self.node, g["index"])
            g["pci_bus_id"] = F.pci_bus_id(g["index"])
            g["busy"] = g["index"] in snap.busy_gpus
            if self.vendor is not None:  # what the vendor's exporter reads now, links applied
                g["metrics"] = vendor_values(snap, g["index"])
        doc["vendor"] = self.vendor.vendor.value if self.vendor is not None else "nvidia"
        doc["model_name"] = self.model_name
        doc["kernel_log"] = str(self.kernel_log)
        doc["fabric"] = [
            {"ifname": link.ifname, "present": link.present, "operstate": link.operstate, "up": link.up,
             "carrier_changes": link.carrier_changes,
             # The port's rate as its exporter publishes it (fabric.port_rate_bytes; None without a
             # declared link speed): what `gpufleet inspect` compares with the stack's speed.
             "rate_bytes_per_second": (port_rate_bytes(self.link_speed_gbps, link.shaped_rate)
                                       if self.link_speed_gbps is not None and link.present else None)}
            for link in snap.links
        ]
        doc["host"] = dict(snap.host)
        # Read by `gpufleet upgrade run`'s gate and `gpufleet inspect` (version drift).
        doc["driver_version"] = self.versions.driver
        doc["firmware_version"] = self.versions.firmware
        doc["driver_error"] = self.versions.error()
        doc["now"] = self.clock()
        return doc
