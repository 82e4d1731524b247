"""Inspecting the sandbox: its node agents (GET /state over their control sockets, named in the
sandbox's state file, gpufleet.core.sandbox_contract), Slurm's node states (sinfo in the head
namespace) and, on a full sweep, a real TCP bandwidth probe between node pairs over their fabric
veths (bwprobe.py). Nothing here reaches into gpufleet.sandbox's internals.

`observation_from_agent` is the pure part: an agent document -> a NodeObservation."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gpufleet.config.accelerators import AcceleratorModel
from gpufleet.core.agent_client import AgentError, agent_request, agent_state
from gpufleet.core.sandbox_contract import SandboxNode, SandboxState
from gpufleet.core.slurm_state import SINFO_ARGS, parse_sinfo
from gpufleet.fleet.inspect.exclusions import job_exclusions
from gpufleet.fleet.inspect.observation import GpuObs, NodeObservation, PortObs, SchedState
from gpufleet.fleet.inspect.slurm_cluster import sched_state_of

# DCGM field ids (shared/reference/gpu-faults.md "DCGM"), as the agent's /state keys them.
F_ECC_SBE_VOL, F_ECC_DBE_VOL = "310", "311"
F_UNCORR_REMAPPED_ROWS, F_REMAP_FAILURE, F_REMAP_PENDING = "393", "395", "396"
NOT_OBSERVABLE = {
    "pcie": "the sandbox's GPUs are the node agent's fakes: they have no PCIe link to read",
}
PROBE_RATE_MBIT = 400.0
PROBE_SECONDS = 2.0
PROBE_PORT = 5201
PERF_METRIC = "fabric_tcp_mbps"


def _xids_since_reset(doc: dict[str, Any], gpu: int, reset_at: float | None) -> tuple[int, ...]:
    return tuple(int(e["xid"]) for e in doc.get("events", [])
                 if int(e["gpu"]) == gpu and (reset_at is None or float(e["at"]) > reset_at))


def observation_from_agent(
    doc: dict[str, Any], *, node: str, pool: str, sku: AcceleratorModel, expected_gpus: int,
    expected_port_gbps: float | None, sched_state: SchedState, at: float,
) -> NodeObservation:
    gpus = []
    for g in doc["gpus"]:
        fields = {str(k): float(v) for k, v in g.get("fields", {}).items()}
        idx = int(g["index"])
        held = g.get("fault")
        gpus.append(GpuObs(
            index=idx, xids=_xids_since_reset(doc, idx, g.get("reset_at")),
            health_fault=held.get("fault_id") if isinstance(held, dict) else None,
            ecc_correctable_volatile=fields.get(F_ECC_SBE_VOL, 0.0),
            ecc_uncorrectable_volatile=fields.get(F_ECC_DBE_VOL, 0.0),
            uncorrectable_remapped_rows=fields.get(F_UNCORR_REMAPPED_ROWS, 0.0),
            row_remap_failed=fields.get(F_REMAP_FAILURE, 0.0),
            row_remap_pending=fields.get(F_REMAP_PENDING, 0.0),
        ))
    ports = []
    for f in doc.get("fabric", []):
        state = "absent" if not f.get("present", True) else ("up" if f.get("up") else "down")
        rate = f.get("rate_bytes_per_second")
        ports.append(PortObs(name=str(f["ifname"]), state=state,
                             speed_gbps=None if rate is None else float(rate) * 8 / 1e9,
                             carrier_changes=int(f.get("carrier_changes", 0))))
    not_observable = dict(NOT_OBSERVABLE)
    # Versions: the agent reports those it was started with (a rolling upgrade changes them); an
    # agent started without one leaves that drift check skipped, with the reason.
    for what in ("driver", "firmware"):
        if doc.get(f"{what}_version") is None:
            not_observable[what] = f"the sandbox's node agent reports no {what} version"
    return NodeObservation(
        node=node, pool=pool, sku=sku, at=at, expected_gpus=expected_gpus, sched_state=sched_state,
        gpus=tuple(gpus), ports=tuple(ports), expected_port_gbps=expected_port_gbps,
        driver_version=doc.get("driver_version"), firmware_version=doc.get("firmware_version"),
        not_observable=not_observable,
    )


def inspected_nodes(state: SandboxState) -> list[SandboxNode]:
    """The Slurm GPU nodes (compute and spares) with an agent."""
    return [n for n in state.nodes if n.role in ("compute", "spare") and n.agent_socket]


def slurm_states(state: SandboxState) -> dict[str, str]:
    try:
        res = subprocess.run(state.slurm_command(*SINFO_ARGS), capture_output=True, text=True, timeout=15,
                             check=False)
    except (OSError, subprocess.TimeoutExpired, RuntimeError):
        return {}
    return {k: v.base_state for k, v in parse_sinfo(res.stdout).items()} if res.returncode == 0 else {}


def slurm_exclusions(state: SandboxState, since: dict[str, float]) -> dict[str, int] | None:
    """Jobs that excluded each node since its previous sweep (None: Slurm could not be read)."""
    try:
        res = subprocess.run(state.slurm_command("scontrol", "-o", "show", "job"), capture_output=True,
                             text=True, timeout=15, check=False)
    except (OSError, subprocess.TimeoutExpired, RuntimeError):
        return None
    if res.returncode != 0:
        return None
    return job_exclusions(res.stdout, since)


def read_token(state: SandboxState) -> str:
    if state.agent_token_file is None:
        raise AgentError("the sandbox's state names no agent token file")
    try:
        return Path(state.agent_token_file).read_text().strip()
    except OSError as e:
        raise AgentError(f"agent token {state.agent_token_file}: {e.strerror}") from None


def gather(state: SandboxState, *, pool: str, sku: AcceleratorModel, expected_gpus: int,
           expected_port_gbps: float | None, since: dict[str, float] | None = None) -> list[NodeObservation]:
    """Every GPU node's observation, read in parallel; an unreachable agent is an UNKNOWN node.
    `since`: each node's previous sweep (job exclusions are counted after it)."""
    nodes = inspected_nodes(state)
    token = read_token(state)
    sched = slurm_states(state)
    excluded = slurm_exclusions(state, since or {}) or {}

    def one(n: SandboxNode) -> NodeObservation:
        at = time.time()
        st = sched_state_of(sched.get(n.name))
        try:
            doc = agent_state(Path(n.agent_socket or ""), token)
        except AgentError as e:
            return NodeObservation(node=n.name, pool=pool, sku=sku, at=at, expected_gpus=expected_gpus,
                                   sched_state=st, unknown=(f"gpus: {e}", f"fabric: {e}"))
        o = observation_from_agent(doc, node=n.name, pool=pool, sku=sku, expected_gpus=expected_gpus,
                                   expected_port_gbps=expected_port_gbps, sched_state=st, at=at)
        return o.model_copy(update={"job_exclusions": excluded.get(n.name, 0)})

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(nodes)))) as ex:
        return list(ex.map(one, nodes))


# --------------------------------------------------------------------------- bandwidth probe


def _fabric_ip(n: SandboxNode) -> str | None:
    return n.fabric[0].address.split("/")[0] if n.fabric else None


def probe_pair(sender: SandboxNode, receiver: SandboxNode, seconds: float = PROBE_SECONDS,
               rate_mbit: float = PROBE_RATE_MBIT, port: int = PROBE_PORT) -> float | None:
    """Mbit/s that arrived at `receiver` from `sender` over rail 0 (None: could not measure)."""
    ip = _fabric_ip(receiver)
    if ip is None:
        return None
    py = sys.executable
    rx = subprocess.Popen(["ip", "netns", "exec", receiver.netns, py, "-m", "gpufleet.fleet.inspect.bwprobe",
                           "recv", "--bind", ip, "--port", str(port), "--timeout", str(seconds + 15)],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert rx.stdout is not None
        if "listening" not in rx.stdout.readline():
            return None
        tx = subprocess.run(["ip", "netns", "exec", sender.netns, py, "-m", "gpufleet.fleet.inspect.bwprobe",
                             "send", "--to", ip, "--port", str(port), "--seconds", str(seconds),
                             "--rate-mbit", str(rate_mbit)], capture_output=True, text=True,
                            timeout=seconds + 20, check=False)
        out, _ = rx.communicate(timeout=seconds + 20)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        rx.kill()
        rx.wait()
        return None
    if tx.returncode != 0 or rx.returncode != 0:
        return None
    try:
        return float(json.loads(out.strip().splitlines()[-1])["mbit_per_s"])
    except (ValueError, KeyError, IndexError):
        return None


def measure(state: SandboxState, pairs: Sequence[tuple[str, str]], unpaired: Sequence[str]
            ) -> dict[str, float]:
    """Each node's send bandwidth to its pair partner (both directions, one after the other, so
    the shared CPUs carry one stream at a time); an odd node out sends to the first node."""
    by_name = {n.name: n for n in state.nodes}
    out: dict[str, float] = {}
    legs = [(a, b) for a, b in pairs] + [(b, a) for a, b in pairs]
    if unpaired and pairs:
        legs += [(u, pairs[0][0]) for u in unpaired]
    for a, b in legs:
        v = probe_pair(by_name[a], by_name[b])
        if v is not None:
            out[a] = v
    return out


# --------------------------------------------------------------------------- degradations


def degrade_ecc(state: SandboxState, node: str, gpu: int = 0, add: float = 100.0) -> float:
    """Raise a GPU's correctable ECC count (DCGM field 310) by `add`, as `dcgmi test --inject`
    would set it; returns the new value. Rising between sweeps is the degradation."""
    n = next(x for x in state.nodes if x.name == node)
    token = read_token(state)
    doc = agent_state(Path(n.agent_socket or ""), token)
    g = next(g for g in doc["gpus"] if int(g["index"]) == gpu)
    cur = float(g.get("fields", {}).get(F_ECC_SBE_VOL, 0))
    agent_request(Path(n.agent_socket or ""), token, "POST", "/inject",
                  {"gpu": gpu, "field_id": int(F_ECC_SBE_VOL), "value": cur + add})
    return cur + add


def degrade_flap(state: SandboxState, node: str, count: int = 3, down_s: float = 0.2) -> int:
    """Take the node's rail-0 cable out and back `count` times (its veth peer on the fabric bridge:
    a real carrier loss the node's kernel counts)."""
    n = next(x for x in state.nodes if x.name == node)
    peer = n.fabric[0].peer
    for _ in range(count):
        subprocess.run(["ip", "link", "set", peer, "down"], check=True, timeout=10)
        time.sleep(down_s)
        subprocess.run(["ip", "link", "set", peer, "up"], check=True, timeout=10)
        time.sleep(down_s)
    return count


# tbf counts whole frames (skb length: the 14-byte Ethernet header + 1500-byte IP packet) while the
# probe counts TCP payload (1448 bytes per full segment with timestamps): a cap of x on the wire
# carries x * 1448/1514 of payload. Measured without this: a 0.85 cap read 80.8 % of the pool.
WIRE_PER_PAYLOAD = 1514 / 1448


def degrade_slow(state: SandboxState, node: str, factor: float = 0.85, rate_mbit: float = PROBE_RATE_MBIT,
                 clear: bool = False) -> None:
    """Cap the node's rail-0 port with a tc token bucket in the node's namespace so that its
    payload bandwidth is `factor` x the probe's offered rate (clear: remove it)."""
    n = next(x for x in state.nodes if x.name == node)
    ifname = n.fabric[0].ifname
    if clear:
        subprocess.run(["ip", "netns", "exec", n.netns, "tc", "qdisc", "del", "dev", ifname, "root"],
                       check=False, timeout=10, capture_output=True)
        return
    rate = rate_mbit * factor * WIRE_PER_PAYLOAD
    burst_kbit = max(32, int(rate * 1000 / 250))  # burst >= rate/HZ (tc-tbf(8)), as the chaos backends do
    subprocess.run(["ip", "netns", "exec", n.netns, "tc", "qdisc", "replace", "dev", ifname, "root", "tbf",
                    "rate", f"{rate:g}mbit", "burst", f"{burst_kbit}kbit", "latency", "50ms"],
                   check=True, timeout=10, capture_output=True)
