"""Kubernetes recovery at scale: 10 nodes fail at once on the Kubernetes sandbox at 1,250 nodes
(10,000 GPUs), and what the chaos backend's target selection and blast-radius guard cost at that size.

    .venv/bin/python benchmarks/kube_recovery.py                     # scale-10k at 1,250 nodes, 10 crashes
    .venv/bin/python benchmarks/kube_recovery.py --nodes 1250 --fail 10 --training 2

What it does, in a state root of its own (a temporary folder; it never meets another sandbox):
1. `sandbox up --kubernetes` of the stack at `--nodes` with a training Job of `--training` pods
   (the stack file is copied with `gameday.maxNodesDown` = `--fail`, so the guard lets the 10 through,
   and the copy's training size; everything else is the stack's, the remediation policy included);
   then waits until every node is schedulable (the node lifecycle controller lifts the
   `not-ready` taints late at that size);
2. target selection: `@job:<i>` and `@idle:<i>` resolved through the backend (lists nodes and the
   Job's pods), and the blast-radius guard for the `--fail` targets, once with the stack's own
   `maxNodesDown` (refused: the reasons are recorded) and once with the copy's (allowed), timed;
3. `--fail` node crashes at once (the training Job's nodes first, then idle ones), each through the
   engine (guard, ledger, Lease takeover), from a thread each;
4. polls the nodes and the Job's pods every second: per node the time to NotReady (detect), to
   unschedulable/quarantined (isolate) and to out-of-service (fenced), and the time until every
   training pod is Running again (recover); the remediation's circuit breaker status;
5. reverts the ledger and times until every node is schedulable again; `down`.
Writes benchmarks/results/kube_recovery.json. Figures, not asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gpufleet.chaos import engine
from gpufleet.chaos.backends.kubernetes import node_obs
from gpufleet.chaos.ledger import Ledger, revert_pending
from gpufleet.chaos.node import actions as node_actions
from gpufleet.chaos.rollbacks import ROLLBACKS
from gpufleet.config import load_named_stack
from gpufleet.core.node_health import OUT_OF_SERVICE_TAINT, QUARANTINE_TAINT
from gpufleet.sandbox.kube.cluster import KubeUpOptions, api_from_kubeconfig, kube_down, kube_up

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "kube_recovery.json"


def _stack_copy(stack: str, stacks_dir: Path, max_down: int, training: int) -> Path:
    """The stack file with gameday.maxNodesDown and the sandbox's training size set (text edit: the
    file keeps its comments and everything else)."""
    text = (REPO / "stacks" / f"Pulumi.{stack}.yaml").read_text()
    text, n = re.subn(r"(\n    maxNodesDown: )\d+", rf"\g<1>{max_down}", text)
    assert n == 1, "no gameday.maxNodesDown in the stack file"
    if "gpufleet:sandbox:" not in text:
        text += f"  gpufleet:sandbox:\n    training:\n      nodes: {training}\n"
    path = stacks_dir / f"Pulumi.{stack}.yaml"
    path.write_text(text)
    return path


def _timed(fn: Any) -> tuple[Any, float]:
    t = time.perf_counter()
    out = fn()
    return out, round(time.perf_counter() - t, 3)


def one(stack: str, nodes: int, fail: int, training: int, timeout_s: float) -> dict[str, Any]:
    load_before = round(os.getloadavg()[0], 2)
    own = load_named_stack(stack, REPO / "stacks")
    with tempfile.TemporaryDirectory(prefix="kube-recovery-") as tmp:
        root, stacks_dir = Path(tmp) / "root", Path(tmp) / "stacks"
        stacks_dir.mkdir()
        _stack_copy(stack, stacks_dir, fail, training)
        spec = load_named_stack(stack, stacks_dir)
        os.environ["GPUFLEET_SANDBOX_ROOT"] = str(root)
        cfg: dict[str, Any] = {
            "gpufleet_backend": "kubernetes", "gpufleet_stack": stack, "gpufleet_stacks_dir": str(stacks_dir),
            "gpufleet_sandbox_root": str(root), "gpufleet_ledger": str(Path(tmp) / "faults.jsonl"),
            "gpufleet_allow_production": True,
        }
        out: dict[str, Any] = {"stack": stack, "nodes": nodes, "fail": fail, "training_pods": training,
                               "load_avg_1m_before": load_before}
        t0 = time.monotonic()
        try:
            rec, timings = kube_up(stack, spec, KubeUpOptions(nodes=nodes, timeout_s=timeout_s), root=root)
            out["up_seconds"] = round(time.monotonic() - t0, 1)
            out["up_marks"] = timings.marks
            state = rec.state
            assert state.admin_kubeconfig is not None
            admin = api_from_kubeconfig(Path(state.admin_kubeconfig), timeout=60)
            out["settle"] = _settle(admin, timeout_s)
            ctx = engine.context(cfg)
            backend = ctx.backend()
            out["selection"] = _selection(ctx, backend, own.gameday.max_nodes_down, fail)
            targets = out["selection"].pop("targets")
            out["crash"] = _crash(cfg, admin, targets, state.remediation_status, timeout_s)
            out["return"] = _revert(cfg, admin, targets, timeout_s)
            admin.close()
        finally:
            engine.end_runs()
            t1 = time.monotonic()
            report = kube_down(stack, root)
            out["down_seconds"] = round(time.monotonic() - t1, 1)
            out["down_clean"] = bool(report and report.clean)
        out["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
        return out


def _settle(admin: Any, timeout_s: float) -> dict[str, Any]:
    """After `up` (every node Ready), until every node is schedulable: at 1,250 nodes the node
    lifecycle controller lifts the `not-ready` taints of nodes already Ready for minutes, and the
    guard counts a tainted node as down."""
    t = time.monotonic()
    worst = 0
    left = -1
    while time.monotonic() - t < timeout_s:
        left = sum(1 for n in admin.list("Node") if not node_obs(n).schedulable)
        worst = max(worst, left)
        if left == 0:
            break
        time.sleep(2.0)
    return {"seconds": round(time.monotonic() - t, 1), "most_unschedulable": worst, "left": left}


def _selection(ctx: engine.Context, backend: Any, own_max: int, fail: int) -> dict[str, Any]:
    states, list_s = _timed(backend.node_states)
    pods, pods_s = _timed(backend.training_pods)
    job0, job_s = _timed(lambda: engine.resolve_node(backend, "@job:0"))
    idle0, idle_s = _timed(lambda: engine.resolve_node(backend, "@idle:0"))
    job = list(pods.nodes)
    idle = [n for n in sorted(states) if n not in job and states[n].schedulable]
    targets = (job + idle)[:fail]
    allowed, guard_s = _timed(lambda: engine.check_blast_radius(ctx, backend, set(targets), False))
    assert ctx.stack is not None
    own_stack = ctx.stack.model_copy(update={"gameday": ctx.stack.gameday.model_copy(
        update={"max_nodes_down": own_max})})
    own_ctx = engine.Context(ctx.settings, own_stack, ctx.backend_name, ctx.run)
    refused, own_guard_s = _timed(lambda: engine.check_blast_radius(own_ctx, backend, set(targets), False))
    return {
        "targets": targets,
        "list_nodes_seconds": list_s, "nodes_listed": len(states),
        "training_pods_seconds": pods_s, "resolve_job0_seconds": job_s, "job0": job0,
        "resolve_idle0_seconds": idle_s, "idle0": idle0,
        "guard_seconds": guard_s, "guard_reasons_with_max_down": {str(fail): allowed},
        "guard_seconds_stack_max_down": own_guard_s,
        "guard_reasons_stack_max_down": {str(own_max): refused},
    }


def _crash(cfg: dict[str, Any], admin: Any, targets: list[str], status_file: str | None,
           timeout_s: float) -> dict[str, Any]:
    engine.new_run("kube-recovery", cfg)
    injected: dict[str, float] = {}
    lock = threading.Lock()

    def crash(node: str) -> None:
        r = node_actions.crash_node(node, configuration=cfg)
        with lock:
            injected[node] = float(r["at"])

    t = time.time()
    with ThreadPoolExecutor(len(targets)) as pool:
        list(pool.map(crash, targets))
    spread = max(injected.values()) - min(injected.values())
    first = min(injected.values())
    notready: dict[str, float] = {}
    isolated: dict[str, float] = {}
    fenced: dict[str, float] = {}
    recovered = None
    interrupted = None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = time.time()
        for n in admin.list("Node"):
            name = n["metadata"]["name"]
            if name not in injected:
                continue
            o = node_obs(n)
            taints = {x.get("key") for x in (n.get("spec") or {}).get("taints") or []}
            if o.problem and name not in notready:
                notready[name] = now
            if QUARANTINE_TAINT in taints and name not in isolated:
                isolated[name] = now
            if OUT_OF_SERVICE_TAINT in taints and name not in fenced:
                fenced[name] = now
        job = admin.get("/apis/batch/v1/namespaces/default/jobs/gpufleet-training")
        want = int(job["spec"]["parallelism"])
        pods = admin.list("Pod", "default", labelSelector="job-name=gpufleet-training")
        running = sum(1 for p in pods if p["status"].get("phase") == "Running"
                      and not p["metadata"].get("deletionTimestamp")
                      and any(c["type"] == "Ready" and c["status"] == "True"
                              for c in p["status"].get("conditions") or []))
        if running < want and interrupted is None:
            interrupted = now
        if interrupted is not None and running >= want and recovered is None:
            recovered = now
        if recovered is not None and len(fenced) == len(injected):
            break
        time.sleep(1.0)

    def per_node(seen: dict[str, float]) -> dict[str, Any]:
        d = [seen[n] - injected[n] for n in seen]
        if not d:
            return {"nodes": 0}
        return {"nodes": len(seen), "min_s": round(min(d), 1), "median_s": round(statistics.median(d), 1),
                "max_s": round(max(d), 1)}

    breaker = json.loads(Path(status_file).read_text()) if status_file and Path(status_file).exists() else {}
    return {
        "inject_wall_seconds": round(max(injected.values()) - t, 2),
        "inject_spread_seconds": round(spread, 2),
        "detect_notready": per_node(notready),
        "isolate_quarantined": per_node(isolated),
        "fenced_out_of_service": per_node(fenced),
        "job_interrupted_s": round(interrupted - first, 1) if interrupted else None,
        "job_recovered_s": round(recovered - first, 1) if recovered else None,
        "remediation": {"quarantined": len(breaker.get("quarantined", {})),
                        "breaker_open": breaker.get("breaker_open"), "notes": breaker.get("notes", [])[:5]},
    }


def _revert(cfg: dict[str, Any], admin: Any, targets: list[str], timeout_s: float) -> dict[str, Any]:
    t = time.time()
    results = revert_pending(Ledger(Path(cfg["gpufleet_ledger"])), ROLLBACKS)
    back: dict[str, float] = {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and len(back) < len(targets):
        now = time.time()
        for n in admin.list("Node"):
            name = n["metadata"]["name"]
            if name in targets and name not in back and node_obs(n).schedulable:
                back[name] = now
        time.sleep(1.0)
    d = sorted(v - t for v in back.values())
    return {"reverted": len(results), "failed": sum(1 for r in results if not r.ok), "returned": len(back),
            "median_s": round(statistics.median(d), 1) if d else None,
            "max_s": round(max(d), 1) if d else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stack", default="scale-10k")
    ap.add_argument("--nodes", type=int, default=1250)
    ap.add_argument("--fail", type=int, default=10, help="nodes that crash at once")
    ap.add_argument("--training", type=int, default=2, help="pods of the training Job (the sandbox default)")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    print(f"{args.stack} at {args.nodes} nodes, {args.fail} crashes at once ...", flush=True)
    r = one(args.stack, args.nodes, args.fail, args.training, args.timeout)
    print(json.dumps(r, indent=2), flush=True)
    doc = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "run": r,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
