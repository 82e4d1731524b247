"""A sandbox node's RebootProgram (slurm.conf(5)): what `scontrol reboot` runs on the node.

slurmd runs the generated `reboot.sh` inside the node's namespaces when slurmctld issues the reboot;
the script starts this module detached (`setsid -f`: it stops slurmd, its parent). It then:
1. stops the node's daemons (slurmd, the node agent) recorded in the state file, after checking
   each PID's start time (SIGTERM, SIGKILL after 10 s);
2. starts them again from their recorded Launch recipes, in a NEW time namespace whose uptime
   starts at 0 (gpufleet.sandbox.boot): slurmd then registers with a boot time later than Slurm's
   reboot request, which is what completes a `scontrol reboot`;
3. records the new PIDs and recipes in the state file.
What the node boots into is its recipes: an upgrade driver changes the agent's recipe (its
`--driver-version` / `--firmware-version`) before it asks Slurm for the reboot, as a real node's
package install precedes its reboot. The agent is started first and must answer before slurmd
starts, because slurmd runs the HealthCheckProgram once at start-up (scontrol(1), reboot), and a
check that cannot reach its agent would drain the node with a fault's reason.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path

from gpufleet.core.procs import alive, launch, start_time
from gpufleet.core.sandbox_contract import SandboxProcess, read_state, write_state
from gpufleet.sandbox import boot
from gpufleet.sandbox.agents import AgentClient

log = logging.getLogger("gpufleet.sandbox.node_reboot")

STOP_GRACE_S = 10.0
AGENT_READY_S = 30.0


def stop(procs: list[SandboxProcess]) -> None:
    for p in procs:
        seen = start_time(p.pid)
        log.info("%s: pid %d, start time %s (recorded %d)", p.name, p.pid, seen, p.start_time)
        if alive(p.pid, p.start_time):
            os.kill(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline and any(alive(p.pid, p.start_time) for p in procs):
        time.sleep(0.1)
    for p in procs:
        if alive(p.pid, p.start_time):
            log.warning("%s (pid %d) ignored SIGTERM for %.0f s: SIGKILL", p.name, p.pid, STOP_GRACE_S)
            os.kill(p.pid, signal.SIGKILL)


def boot_order(procs: list[SandboxProcess]) -> list[SandboxProcess]:
    """The node agent before slurmd (and anything else after both)."""
    def rank(p: SandboxProcess) -> int:
        return 0 if p.name.startswith("agent@") else 1 if p.name.startswith("slurmd@") else 2
    return sorted(procs, key=rank)


def reboot(stack: str, root: Path, node: str, started: float) -> int:
    state = read_state(stack, root)
    procs = [p for p in state.processes if p.node == node]
    if not procs:
        log.error("no recorded daemons for node %s in %s's state file", node, stack)
        return 2
    t0 = time.time()
    log.info("reboot of %s: stopping %s", node, ", ".join(p.name for p in procs))
    stop(procs)
    # Slurm takes the reboot as done only when the boot time it computes (whole seconds, rounded
    # against the node: gpufleet.sandbox.boot.slurm_boot_time) is no older than the request, which
    # came before this program started.
    time.sleep(max(0.0, boot.reboot_offset_not_before(started) - time.time()))
    offset = boot.new_boot_offset()
    token = Path(state.agent_token_file).read_text().strip() if state.agent_token_file else ""
    updated: dict[str, SandboxProcess] = {}
    for p in boot_order(procs):
        recipe = p.launch.model_copy(update={"program": boot.booted(p.launch.program, offset)})
        sock = state.node(node).agent_socket
        is_agent = p.name.startswith("agent@")
        if is_agent and sock:
            Path(sock).unlink(missing_ok=True)
        popen, _ = launch(recipe)
        st = start_time(popen.pid)
        if st is None:
            log.error("%s did not start (rc %s); see %s", p.name, popen.poll(), recipe.log)
            continue
        updated[p.name] = p.model_copy(update={"pid": popen.pid, "start_time": st, "launch": recipe})
        if is_agent and sock:
            client = AgentClient(sock, token, timeout=1)
            try:
                deadline = time.monotonic() + AGENT_READY_S
                while time.monotonic() < deadline and not client.healthy():
                    time.sleep(0.1)
            finally:
                client.close()
    # Re-read: the state file may have changed while the daemons stopped.
    state = read_state(stack, root)
    write_state(state.model_copy(update={"processes": [updated.get(p.name, p) for p in state.processes]}),
                root)
    log.info("reboot of %s: %s started with boot-time offset %d s in %.1f s", node,
             ", ".join(updated), offset, time.time() - t0)
    return 0 if len(updated) == len(procs) else 1


def main(argv: list[str] | None = None) -> int:
    started = time.time()  # wall clock: compared with slurmctld's time(2)
    ap = argparse.ArgumentParser(prog="python -m gpufleet.sandbox.node_reboot", description=__doc__)
    ap.add_argument("--stack", required=True)
    ap.add_argument("--state-root", required=True, type=Path)
    ap.add_argument("--node", default=None, help="default: this UTS namespace's hostname (the node's)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    return reboot(args.stack, args.state_root, args.node or socket.gethostname(), started)


if __name__ == "__main__":
    sys.exit(main())
