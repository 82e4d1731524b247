"""`gpufleet node-health` / `python -m gpufleet.health`: check this node, print a verdict that fits
node-problem-detector's custom-plugin contract (exit 0 OK, 1 problem, 2 unknown; one line on
stdout), and, as Slurm's HealthCheckProgram (whose exit code Slurm ignores), drain the node itself.

`python -m gpufleet.health` imports only what the check needs (no CLI framework), so it starts fast
enough to run every few seconds from slurmd (docs/node-agent.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from gpufleet.catalog import Catalog, XidRule, load_catalog, xid_policy
from gpufleet.catalog.policy import OverrideLike, parse_overrides
from gpufleet.core.errors import InputError, Problem
from gpufleet.core.host import CMD_TIMEOUT_S
from gpufleet.core.maintenance import held_by_rollout
from gpufleet.core.slurm_state import SINFO_ARGS, parse_sinfo
from gpufleet.health import sources as S
from gpufleet.health.decide import Finding, Verdict, describe, drain_argv, drain_reason, evaluate
from gpufleet.health.observe import GpuReading, LinkReading, Observations, XidSeen, merge_xids


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpufleet node-health", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--node", default=os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
                   help="node name (default: $SLURMD_NODENAME, else the hostname)")
    p.add_argument("--format", choices=["npd", "text", "json"], default="npd")
    p.add_argument("--stack", help="apply this stack's remediation.xidOverrides to the XID policy")
    p.add_argument("--stacks-dir", default="stacks", type=Path)
    p.add_argument("--xid-overrides", help="the overrides themselves, as JSON (the sandbox passes its "
                   "stack's): {\"<xid>\": {\"action\", \"reason\", \"faultClass\"}}")
    p.add_argument("--slurm-drain", action="store_true",
                   help="drain this node in Slurm for faults whose action isolates the node")
    p.add_argument("--scontrol", default=shutil.which("scontrol") or "/usr/bin/scontrol")
    p.add_argument("--sinfo", default=shutil.which("sinfo") or "/usr/bin/sinfo",
                   help="read the node's drain reason before draining: a node a rolling upgrade holds "
                   "is left to the rollout (gpufleet.core.maintenance)")
    p.add_argument("--kernel-log", type=Path, help="kern.log to read (default: dmesg; sandbox: the agent's)")
    p.add_argument("--fabric-ifnames", default="", help="fabric interfaces (default: sandbox agent's, "
                   "else InfiniBand ports under /sys/class/infiniband)")
    p.add_argument("--anchor-ifname", help="an interface always present on the node (management NIC): "
                   "when it is visible and every fabric port is absent, the ports are gone (failed NICs), "
                   "not in another network namespace")
    p.add_argument("--checkpoint-mount", type=Path, help="check that this mount answers a stat in time")
    p.add_argument("--exporter-url", help="an AMD or Ascend node: read the GPUs from the node's own "
                   "exporter instead of DCGM/NVML (device-metrics-exporter http://127.0.0.1:5000/metrics, "
                   "npu-exporter's /metrics); the catalog's exporter-field checks read its series")
    p.add_argument("--lock-file", type=Path, help="one check at a time per node (default under /run/lock)")
    p.add_argument("--before-drain", metavar="COMMAND",
                   help="run this shell command before draining (a diagnostic bundle: "
                   "docs/diagnostic-bundles.md), once per fault while it persists; it gets GPUFLEET_NODE, "
                   "GPUFLEET_DRAIN_REASON, GPUFLEET_FAULT_ID and GPUFLEET_DETECTED_AT; the drain follows "
                   "whatever it does")
    p.add_argument("--before-drain-timeout", type=float, default=8.0, metavar="SECONDS",
                   help="kill the before-drain command after this long and drain (default 8: the longest "
                   "it may delay a drain)")
    p.add_argument("--wait-lock", type=float, default=0.0, metavar="SECONDS",
                   help="wait up to this long for a running check of this node to end, then check "
                   "(default 0: skip, as Slurm's periodic HealthCheckProgram should; the Epilog waits)")
    sb = p.add_argument_group("sandbox")
    sb.add_argument("--sandbox", action="store_true", help="read the sandbox node agent instead of DCGM/NVML")
    sb.add_argument("--agent-socket", type=Path)
    sb.add_argument("--token-file", type=Path)
    return p


# --------------------------------------------------------------------------- gathering


def _ifnames(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def _links(names: list[str], unknown: list[str], anchor: str | None = None) -> tuple[LinkReading, ...] | None:
    links = S.read_net_links(names)
    # None of the node's ports exists here: unless the anchor interface (always present on the node,
    # e.g. its management NIC) is visible, we are in the wrong network namespace (or /sys was not
    # remounted for it), not looking at a node whose every port vanished.
    if (names and all(link.state == "absent" for link in links)
            and (anchor is None or S.read_net_links([anchor])[0].state == "absent")):
        unknown.append(f"fabric interfaces {','.join(names)} not visible in this network namespace")
        return None
    return tuple(links)


def gather_sandbox(args: argparse.Namespace, now: float) -> Observations:
    unknown: list[str] = []
    if args.agent_socket is None or args.token_file is None:
        raise ValueError("--sandbox needs --agent-socket and --token-file")
    try:
        doc = S.agent_state(args.agent_socket, S.read_token(args.token_file))
    except S.SourceError as e:
        return Observations(args.node, now, None, (), None, unknown=(str(e),))
    gpus, pci, events = S.agent_readings(doc)
    xids: list[XidSeen] = list(events)
    klog = args.kernel_log or (Path(doc["kernel_log"]) if doc.get("kernel_log") else None)
    if klog is not None:
        try:
            xids = merge_xids(events, S.read_kernel_log(klog, pci, now).xids)
        except S.SourceError as e:
            unknown.append(str(e))
    names = _ifnames(args.fabric_ifnames) or [str(f["ifname"]) for f in doc.get("fabric", [])]
    links = _links(names, unknown, args.anchor_ifname)
    raw_host = doc.get("host")
    host = {str(k): float(v) for k, v in raw_host.items()} if isinstance(raw_host, dict) else None
    return _with_mount(args, Observations(args.node, now, tuple(gpus), tuple(xids), links,
                                          unknown=tuple(unknown), host=host))


def gather_real(args: argparse.Namespace, now: float) -> Observations:
    unknown: list[str] = []
    gpus: list[GpuReading] | None = None
    pci: dict[str, int] = {}
    if args.exporter_url:
        try:
            gpus = S.read_exporter(args.exporter_url)
        except S.SourceError as e:
            unknown.append(f"no GPU source: {e}")
    else:
        try:
            gpus, pci = S.read_nvml()
        except S.SourceError as e:
            nvml_err = str(e)
        else:
            nvml_err = ""
        try:
            gpus = S.read_dcgm()  # DCGM has more fields; NVML still gave the PCI map
        except S.SourceError as e:
            if gpus is None:
                unknown.append(f"no GPU source: {e}; {nvml_err}")
    xids: tuple[XidSeen, ...] = ()
    try:
        log = S.read_kernel_log(args.kernel_log, pci, now) if args.kernel_log else S.read_dmesg(pci, now)
    except S.SourceError as e:
        unknown.append(str(e))
    else:
        xids = log.xids
        if gpus is not None:
            # A reset recorded in the log (`gpufleet gpu-reset`) dates the GPU's reset, as the sandbox
            # agent's /clear does: XIDs before it are history (escalation still counts them).
            pci_of = {i: p for p, i in pci.items()}
            gpus = [dataclasses.replace(g, reset_at=log.reset_at(pci_of.get(g.index))) for g in gpus]
    names = _ifnames(args.fabric_ifnames)
    links: tuple[LinkReading, ...] | None
    links = _links(names, unknown) if names else tuple(S.read_ib_ports())
    readings = None if gpus is None else tuple(gpus)
    obs = Observations(args.node, now, readings, xids, links, unknown=tuple(unknown))
    return _with_mount(args, obs)


def _with_mount(args: argparse.Namespace, obs: Observations) -> Observations:
    if args.checkpoint_mount is None:
        return obs
    path = str(args.checkpoint_mount)
    try:
        took = S.stat_latency(args.checkpoint_mount, timeout=30.0)
    except S.SourceError as e:
        return dataclasses.replace(obs, mount_seconds=float("inf"), mount_path=path,
                                   unknown=(*obs.unknown, str(e)))
    return dataclasses.replace(obs, mount_seconds=took, mount_path=path)


def policy(
    catalog: Catalog, stack: str | None, stacks_dir: Path, overrides_json: str | None = None
) -> dict[int, XidRule]:
    """The XID policy: the catalog with a stack's overrides (--stack, or --xid-overrides as JSON)."""
    overrides: Mapping[int, OverrideLike] = {}
    where = f"stack {stack}"
    if overrides_json is not None:
        where = "--xid-overrides"
        try:
            overrides = parse_overrides(overrides_json, where)
        except ValueError as e:
            raise InputError(where, [Problem("(value)", str(e))]) from None
    elif stack:
        from gpufleet.config.load import load_named_stack

        overrides = load_named_stack(stack, stacks_dir).remediation.xid_overrides
    table, problems = xid_policy(catalog, overrides)
    if problems:
        raise InputError(where, problems)
    return table


# --------------------------------------------------------------------------- output


def render(verdict: Verdict, fmt: str, node: str, drained: dict[str, Any] | None) -> str:
    if fmt == "npd":
        return f"{verdict.message}\n"
    if fmt == "json":
        doc = {
            "node": node, "status": verdict.status, "exit_code": verdict.exit_code,
            "message": verdict.message,
            "findings": [
                {"fault_id": f.fault_id, "title": f.title, "action": f.action.value, "gpu": f.gpu,
                 "device": f.device, "xid": f.xid, "at": f.at, "detail": f.detail,
                 "isolates_node": f.action.isolates_node}
                for f in verdict.findings
            ],
            "unknown": list(verdict.unknown), "drain": drained,
        }
        return json.dumps(doc, sort_keys=True) + "\n"
    lines = [f"{node}: {verdict.status.upper()}"]
    lines += [f"  {'!' if f.action.isolates_node else '-'} {describe(f)}  [{f.detail}]"
              for f in verdict.findings]
    lines += [f"  ? {u}" for u in verdict.unknown]
    if drained:
        lines.append(f"  drain: {drained}")
    return "\n".join(lines) + "\n"


def _lock(path: Path, wait_s: float = 0.0) -> IO[str] | None:
    """The node's check lock, or None when another check holds it for longer than `wait_s`."""
    try:
        fh = open(path, "a")  # noqa: SIM115 - held for the whole check, closed by run()
    except OSError:
        return None
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fh
        except BlockingIOError:
            if time.monotonic() >= deadline:
                fh.close()
                return None
            time.sleep(0.05)


def default_lock(node: str) -> Path:
    d = Path("/run/lock") if os.access("/run/lock", os.W_OK) else Path(tempfile.gettempdir())
    return d / f"gpufleet-node-health-{node}.lock"


def run(argv: Sequence[str] | None = None, out: IO[str] = sys.stdout) -> int:
    args = build_parser().parse_args(argv)
    if args.sandbox and (args.agent_socket is None or args.token_file is None):
        out.write("UNKNOWN: --sandbox needs --agent-socket and --token-file\n")
        return 2
    if args.before_drain_timeout <= 0:
        out.write("UNKNOWN: --before-drain-timeout must be > 0\n")
        return 2
    if args.wait_lock < 0:
        out.write("UNKNOWN: --wait-lock must be >= 0\n")
        return 2
    lock = _lock(args.lock_file or default_lock(args.node), args.wait_lock)
    if lock is None:
        # Slurm starts a new check every interval even if the last one still runs: never pile up.
        out.write("cannot check: another node-health check of this node is running\n")
        return 2
    args.hook_marker = Path(f"{lock.name}.before-drain")
    try:
        return _check(args, out)
    finally:
        lock.close()  # releases the flock


def _check(args: argparse.Namespace, out: IO[str]) -> int:
    try:
        catalog = load_catalog()
        table = policy(catalog, args.stack, args.stacks_dir, args.xid_overrides)
    except InputError as e:
        out.write(f"cannot check: {e.file}: " + "; ".join(str(p) for p in e.problems) + "\n")
        return 2
    now = time.time()
    obs = gather_sandbox(args, now) if args.sandbox else gather_real(args, now)
    verdict = evaluate(obs, catalog, table)
    drained: dict[str, Any] | None = None
    target = verdict.drain
    hook = _before_drain(args, target, now) if args.before_drain else None
    holder = rollout_reason(args.sinfo, args.node) if args.slurm_drain and target is not None else None
    if target is not None and holder is not None:
        # A rolling upgrade holds the node: its gate sees the fault and fails, rolls back or holds
        # the node; a drain here would overwrite the rollout's mark and leave two actors on one fault.
        drained = {"reason": drain_reason(target), "rc": None, "stoodAside": holder}
        print(f"gpufleet node-health: {args.node}: stood aside: {drain_reason(target)}; the node is held "
              f"by a rollout ({holder})", file=sys.stderr, flush=True)
    elif args.slurm_drain and target is not None:
        argv_ = drain_argv(args.scontrol, args.node, target)
        try:
            res = subprocess.run(argv_, capture_output=True, text=True, timeout=CMD_TIMEOUT_S, check=False)
            drained = {"reason": drain_reason(target), "rc": res.returncode, "stderr": res.stderr.strip()}
        except (OSError, subprocess.TimeoutExpired) as e:
            drained = {"reason": drain_reason(target), "rc": None, "stderr": str(e)}
        if drained["rc"] != 0:
            print(f"gpufleet node-health: drain failed: {drained['stderr']}", file=sys.stderr)
    if drained is not None and hook is not None:
        drained["before_drain"] = hook
    out.write(render(verdict, args.format, args.node, drained))
    return verdict.exit_code


def fault_key(f: Finding) -> str:
    """One fault while it persists: the same finding on later checks runs the hook no second time."""
    return f"{f.fault_id}|{f.gpu}|{f.device}|{f.xid}"


def _before_drain(args: argparse.Namespace, target: Finding | None, now: float) -> dict[str, Any] | None:
    """Run --before-drain once per fault, bounded by --before-drain-timeout; the drain follows in
    every case. The marker beside the node's lock holds the fault last handled; a check that finds
    nothing to drain clears it, so the next fault gets its own run."""
    marker: Path = args.hook_marker
    if target is None:
        marker.unlink(missing_ok=True)
        return None
    key = fault_key(target)
    try:
        if marker.read_text() == key:
            return None
    except OSError:
        pass
    env = {**os.environ, "GPUFLEET_NODE": args.node, "GPUFLEET_DRAIN_REASON": drain_reason(target),
           "GPUFLEET_FAULT_ID": target.fault_id or "", "GPUFLEET_DETECTED_AT": f"{target.at or now:.3f}",
           # When it will be killed: a command that can finish early (a partial bundle) should.
           "GPUFLEET_BEFORE_DRAIN_DEADLINE": f"{time.time() + args.before_drain_timeout:.3f}"}
    t0 = time.monotonic()
    result: dict[str, Any]
    try:
        # Its own session, so a timeout kills the collector and its children, not only the shell.
        proc = subprocess.Popen(["/bin/sh", "-c", args.before_drain], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
    except OSError as e:
        result = {"rc": None, "error": str(e)}
    else:
        try:
            output, _ = proc.communicate(timeout=args.before_drain_timeout)
            result = {"rc": proc.returncode, "output": output.strip()[-500:]}
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            result = {"rc": None, "error": f"killed after {args.before_drain_timeout:g} s"}
    result["seconds"] = round(time.monotonic() - t0, 3)
    if result["rc"] != 0:
        # slurmd keeps the check's stderr in its log: a bundle that was not made says why there.
        print(f"gpufleet node-health: before-drain: {result}", file=sys.stderr)
    marker.write_text(key)
    return result


def rollout_reason(sinfo: str, node: str) -> str | None:
    """The node's drain reason when a rolling upgrade put it there (held_by_rollout), else None.
    Slurm not answering reads as no rollout: remediation then drains, and the rollout, finding its
    mark overwritten, leaves the node drained (the safe side)."""
    try:
        res = subprocess.run([sinfo, *SINFO_ARGS[1:], "-n", node], capture_output=True, text=True,
                             timeout=CMD_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    obs = parse_sinfo(res.stdout).get(node) if res.returncode == 0 else None
    return obs.reason if obs is not None and held_by_rollout(obs.reason) else None


def main() -> None:
    raise SystemExit(run())
