"""The Kubernetes sandbox's remediation: a stand-in for NVSentinel's fault-quarantine and
node-drainer modules, which the deployed platform runs (gpufleet.infra.self_healing) and which
cannot run here (they are container images; the sandbox runs no container).

What it does, with the stack's remediation policy (`remediation.mode`, `circuitBreaker`, the XID
policy with the stack's overrides), as NVSentinel does with the values the Pulumi program gives it:
- a node whose node-health condition (`GpuFleetProblem`, set by node-problem-detector from the
  generated check; core.node_health) is True is diagnosed from the check's message: an XID is looked
  up in the resolved XID policy (its catalog fault and action), fabric ports not ACTIVE are the
  catalog's `fabric-port-down`; a node whose kubelet is lost (Ready Unknown: the node lifecycle
  controller saw its Lease expire) is the catalog's `node-crash`;
- when the finding's action isolates the node (GPU reset and up on the ladder) it is quarantined:
  cordoned and tainted `gpufleet.io/quarantine=<fault>:NoSchedule`, recorded in an annotation so
  that only its own work is ever undone (mode `cordon` and up; `monitor-only` only says what it
  would do, as NVSentinel's dryRun);
- in mode `cordon-drain-remediate` a quarantined node is drained through the Eviction API
  (policy/v1: PodDisruptionBudgets are honoured; a 429 is retried on the next round, for at most
  DRAIN_TIMEOUT_S), DaemonSet and mirror pods excepted, as `kubectl drain` does; a lost node is also
  given the out-of-service taint (Kubernetes' non-graceful node shutdown), so the pod GC fails and
  removes its pods, which no kubelet will ever stop, and their controllers replace them. NVSentinel's
  fault-remediation would then reboot or replace the node; the sandbox has nothing to reboot, so
  the node stays quarantined until its problem clears (the fault's rollback);
- the circuit breaker: no new quarantine while the nodes quarantined within the window reach the
  stack's `maxQuarantinedShare` of the cluster (rounded as NVSentinel rounds it: Policy.breaker_
  threshold). Unlike NVSentinel's, whose tripped breaker stays tripped until an operator resets
  it, this one closes again once the window no longer holds that many quarantines;
- a quarantined node whose problem has cleared (condition False, Ready again) is released: its
  taints removed, uncordoned if the quarantine cordoned it;
- before it quarantines a node, it runs the before-quarantine hook (`--before-quarantine`: the
  sandbox gives `python -m gpufleet.fleet.bundle --kubeconfig ...`, the node's diagnostic bundle from
  the API server, docs/diagnostic-bundles.md) for every node it is about to quarantine, all at once,
  and waits at most HOOK_TIMEOUT_S: the bundle shows the node before remediation changed it, and a
  hook that hangs delays the quarantine by that bound and no more.

`decide` is pure (node views + policy + history -> actions) and tested on tables; `Controller`
is the thin loop: it watches nodes (list, then a watch stream), reconciles at every change and at
least every second, and writes its status file. It runs as its own ServiceAccount
(`gpufleet-remediation`, rbac.py): nodes get/list/watch/patch, pods list, pods/eviction create;
no secrets, no node status.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.catalog import Catalog, XidRule, load_catalog, xid_policy
from gpufleet.catalog.policy import parse_overrides
from gpufleet.core.breaker import breaker_threshold
from gpufleet.core.maintenance import MAINTENANCE_ANNOTATION, held_by_rollout
from gpufleet.core.node_health import (
    CONDITION,
    OUT_OF_SERVICE_TAINT,
    OUT_OF_SERVICE_VALUE,
    QUARANTINE_ANNOTATION,
    QUARANTINE_TAINT,
    parse_problem,
)
from gpufleet.core.sandbox_contract import RemediationStatus
from gpufleet.core.taxonomy import LadderAction

logger = logging.getLogger("gpufleet.remediation")

MODES = ("monitor-only", "cordon", "cordon-drain-remediate")
FABRIC_FAULT = "fabric-port-down"  # the catalog's fault for fabric ports not ACTIVE
NODE_LOST_FAULT = "node-crash"  # the catalog's fault for a node whose kubelet is lost
UNRECOGNISED = "unrecognised"
DRAIN_TIMEOUT_S = 300.0  # stop retrying evictions a PDB keeps refusing (then say so)
RESYNC_S = 1.0  # reconcile at least this often (eviction retries, the breaker's window)
WATCH_SECONDS = 300  # the API server ends each watch after this; the loop starts another
STRATEGIC = "application/strategic-merge-patch+json"
# The before-quarantine hook's bound: a bundle from the API server is 5 reads (the node checked, then
# the node, its events, its pods, its inspect reading). Measured on the Kubernetes sandbox (2 cores,
# 2026-12-06): the reads 20-25 ms, the whole hook 0.83-1.22 s (median 0.97 s of 5), mostly the
# interpreter's start. The bound must stay small against the catalog's isolate budgets for a GPU
# fault on Kubernetes (our choice, not a vendor's number).
HOOK_TIMEOUT_S = 5.0


# ----------------------------------------------------------------------------- pure


@dataclass(frozen=True)
class Quarantine:
    """What the remediation did to a node (its annotation, JSON): undone exactly on release."""

    fault: str
    cordoned: bool  # it set spec.unschedulable (the node was schedulable before)
    at: float
    fenced: bool = False  # it added the out-of-service taint

    def to_json(self) -> str:
        doc = {"fault": self.fault, "cordoned": self.cordoned, "at": self.at, "fenced": self.fenced}
        return json.dumps(doc, sort_keys=True)

    @staticmethod
    def parse(text: str | None) -> Quarantine | None:
        if not text:
            return None
        try:
            d = json.loads(text)
            return Quarantine(str(d["fault"]), bool(d["cordoned"]), float(d["at"]), bool(d.get("fenced")))
        except (ValueError, KeyError, TypeError):
            return None


@dataclass(frozen=True)
class NodeView:
    """What the decision reads of a Node."""

    name: str
    ready: str  # the Ready condition's status: True | False | Unknown | "" (none yet)
    problem: str | None  # the node-health condition's message when it is True
    unschedulable: bool
    taints: tuple[tuple[str, str], ...]  # (key, effect)
    quarantine: Quarantine | None  # set by this remediation
    maintenance: str | None = None  # a rolling upgrade's reason (core.maintenance), if one holds it

    def has_taint(self, key: str) -> bool:
        return any(k == key for k, _ in self.taints)


def node_view(node: Mapping[str, Any]) -> NodeView:
    meta, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
    conds = {str(c.get("type")): c for c in status.get("conditions") or []}
    health = conds.get(CONDITION)
    return NodeView(
        name=str(meta.get("name")),
        ready=str((conds.get("Ready") or {}).get("status") or ""),
        problem=str(health.get("message") or "") if health and health.get("status") == "True" else None,
        unschedulable=bool(spec.get("unschedulable")),
        taints=tuple((str(t.get("key")), str(t.get("effect"))) for t in spec.get("taints") or []),
        quarantine=Quarantine.parse((meta.get("annotations") or {}).get(QUARANTINE_ANNOTATION)),
        maintenance=(meta.get("annotations") or {}).get(MAINTENANCE_ANNOTATION),
    )


@dataclass(frozen=True)
class Policy:
    """The stack's remediation policy, resolved against the catalog."""

    mode: str
    max_quarantined_share: float
    window_s: float
    xids: Mapping[int, XidRule]  # the XID policy with the stack's overrides (catalog.xid_policy)
    fault_actions: Mapping[str, LadderAction]  # catalog fault -> its action (fabric, node lost)
    drain_timeout_s: float = DRAIN_TIMEOUT_S

    def breaker_threshold(self, total_nodes: int) -> int:
        """Quarantines within the window at which the breaker trips, as NVSentinel's fault-quarantine
        computes it (breaker/slidingWindowBreaker: ceil(nodes x percentage / 100), tripped when the
        nodes cordoned within the window reach it) from the percentage the Pulumi program gives it
        (infra.self_healing: the share as a whole percent, rounded up, at least 1)."""
        return breaker_threshold(self.max_quarantined_share, total_nodes)


@dataclass(frozen=True)
class Finding:
    fault: str  # catalog fault id (UNRECOGNISED: the check failed with a message it does not know)
    action: LadderAction
    lost: bool  # the node's kubelet is lost: its pods need the out-of-service taint to be replaced
    why: str


def diagnose(node: NodeView, policy: Policy) -> Finding | None:
    """What is wrong with a node, from what the API says (pure); None: nothing."""
    if node.ready == "Unknown":
        action = policy.fault_actions.get(NODE_LOST_FAULT, LadderAction.REBOOT_NODE)
        return Finding(NODE_LOST_FAULT, action, True, "Ready is Unknown: the kubelet stopped posting status")
    if node.problem is None:
        return None
    found = parse_problem(node.problem)
    if found.xid is not None:
        rule = policy.xids.get(found.xid)
        if rule is None:  # the check reports only isolating XIDs: trust it
            return Finding(f"xid-{found.xid}", LadderAction.RESET_GPU, False, node.problem)
        why = f"{node.problem} ({rule.source})"
        return Finding(rule.fault_id or f"xid-{found.xid}", rule.action, False, why)
    if found.fabric_ports:
        action = policy.fault_actions.get(FABRIC_FAULT, LadderAction.REBOOT_NODE)
        return Finding(FABRIC_FAULT, action, False, node.problem)
    # The check failed (NonOK) with a message this version does not know: isolate, as the check does.
    return Finding(UNRECOGNISED, LadderAction.RESET_GPU, False, node.problem)


@dataclass(frozen=True)
class Decision:
    quarantine: tuple[tuple[str, Finding], ...] = ()
    drain: tuple[str, ...] = ()  # evict the pods off these nodes
    fence: tuple[str, ...] = ()  # add the out-of-service taint
    release: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    breaker_open: bool = False


def decide(
    nodes: Sequence[NodeView], policy: Policy, recent: Sequence[tuple[float, str]], now: float
) -> Decision:
    """The actions for one round (pure). `recent`: (time, node) of this remediation's quarantines,
    for the circuit breaker's window."""
    drain_mode = policy.mode == "cordon-drain-remediate"
    quarantine: list[tuple[str, Finding]] = []
    drain: list[str] = []
    fence: list[str] = []
    release: list[str] = []
    notes: list[str] = []
    in_window = {name for t, name in recent if now - t <= policy.window_s}
    threshold = policy.breaker_threshold(len(nodes))
    breaker_open = False
    for node in sorted(nodes, key=lambda n: n.name):
        finding = diagnose(node, policy)
        q = node.quarantine
        if q is not None:
            if finding is None:
                release.append(node.name)
                continue
            if drain_mode:
                if now - q.at <= policy.drain_timeout_s:
                    drain.append(node.name)
                if finding.lost and not node.has_taint(OUT_OF_SERVICE_TAINT):
                    fence.append(node.name)
            continue
        if finding is None:
            continue
        if held_by_rollout(node.maintenance):
            # The rollout holds the node and sees the same fault (its health reads): one actor.
            notes.append(f"{node.name}: {finding.fault}: stood aside, held by a rolling upgrade "
                         f"({node.maintenance})")
            continue
        if not finding.action.isolates_node:
            notes.append(f"{node.name}: {finding.fault} ({finding.why}): action {finding.action.value} "
                         "does not isolate the node")
            continue
        if policy.mode == "monitor-only":
            notes.append(f"{node.name}: would quarantine for {finding.fault} (monitor-only)")
            continue
        if len(in_window) >= threshold:
            breaker_open = True
            notes.append(f"{node.name}: not quarantined for {finding.fault}: circuit breaker tripped "
                         f"({len(in_window)} nodes quarantined within {policy.window_s / 60:g} min, "
                         f"threshold {threshold})")
            continue
        in_window.add(node.name)
        quarantine.append((node.name, finding))
        if drain_mode:
            drain.append(node.name)
            if finding.lost:
                fence.append(node.name)
    return Decision(tuple(quarantine), tuple(drain), tuple(fence), tuple(release), tuple(notes), breaker_open)


def _taints(node: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [dict(t) for t in (node.get("spec") or {}).get("taints") or []]


def quarantine_patch(node: Mapping[str, Any], finding: Finding, now: float, fence: bool) -> dict[str, Any]:
    """Cordon, taint, annotate; guarded by the node's resourceVersion (the taint list has no merge
    key: a patch replaces it, so a concurrent change by the node lifecycle controller must win and
    the next round retries)."""
    view = node_view(node)
    taints = [t for t in _taints(node) if t.get("key") != QUARANTINE_TAINT]
    taints.append({"key": QUARANTINE_TAINT, "value": finding.fault[:63], "effect": "NoSchedule"})
    if fence and not view.has_taint(OUT_OF_SERVICE_TAINT):
        taints.append({"key": OUT_OF_SERVICE_TAINT, "value": OUT_OF_SERVICE_VALUE, "effect": "NoExecute"})
    q = Quarantine(finding.fault, cordoned=not view.unschedulable, at=now, fenced=fence)
    return {
        "metadata": {
            "resourceVersion": node["metadata"].get("resourceVersion"),
            "annotations": {QUARANTINE_ANNOTATION: q.to_json()},
        },
        "spec": {"unschedulable": True, "taints": taints},
    }


def fence_patch(node: Mapping[str, Any]) -> dict[str, Any]:
    """Add the out-of-service taint to a quarantined node whose kubelet is now lost."""
    view = node_view(node)
    assert view.quarantine is not None
    q = Quarantine(view.quarantine.fault, view.quarantine.cordoned, view.quarantine.at, True)
    oos = {"key": OUT_OF_SERVICE_TAINT, "value": OUT_OF_SERVICE_VALUE, "effect": "NoExecute"}
    taints = [*_taints(node), oos]
    return {
        "metadata": {"resourceVersion": node["metadata"].get("resourceVersion"),
                     "annotations": {QUARANTINE_ANNOTATION: q.to_json()}},
        "spec": {"taints": taints},
    }


def release_patch(node: Mapping[str, Any]) -> dict[str, Any]:
    """Undo exactly what the quarantine did."""
    view = node_view(node)
    q = view.quarantine
    assert q is not None
    drop = {QUARANTINE_TAINT} | ({OUT_OF_SERVICE_TAINT} if q.fenced else set())
    spec: dict[str, Any] = {"taints": [t for t in _taints(node) if t.get("key") not in drop]}
    if q.cordoned:
        spec["unschedulable"] = False
    return {
        "metadata": {"resourceVersion": node["metadata"].get("resourceVersion"),
                     "annotations": {QUARANTINE_ANNOTATION: None}},
        "spec": spec,
    }


def evictable(pod: Mapping[str, Any]) -> bool:
    """What `kubectl drain` evicts: not a DaemonSet's or a mirror pod, not already finished or being
    deleted."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
        return False
    if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
        return False
    return not any(o.get("kind") == "DaemonSet" for o in meta.get("ownerReferences") or [])


def eviction(name: str, namespace: str) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}


def load_policy(policy_file: Path, catalog: Catalog | None = None) -> Policy:
    """The policy file `sandbox up` writes (mode, circuit breaker, the stack's XID overrides), resolved
    against the catalog as every consumer of the XID policy does."""
    doc = json.loads(policy_file.read_text())
    cat = catalog or load_catalog()
    overrides = parse_overrides(json.dumps(doc.get("xidOverrides") or {}), str(policy_file))
    table, problems = xid_policy(cat, overrides)
    if problems:
        raise ValueError("; ".join(f"{p.path}: {p.message}" for p in problems))
    mode = str(doc["mode"])
    if mode not in MODES:
        raise ValueError(f"{policy_file}: mode {mode!r} is not one of {', '.join(MODES)}")
    breaker = doc.get("circuitBreaker") or {}
    actions = {f: cat.get(f).action for f in (FABRIC_FAULT, NODE_LOST_FAULT)}
    share = float(breaker.get("maxQuarantinedShare", 1.0))
    return Policy(mode, share, float(breaker.get("windowMinutes", 5)) * 60, table, actions)


# ----------------------------------------------------------------------------- the loop


@dataclass
class Controller:
    """Watches nodes, decides, acts; one instance per sandbox (its own ServiceAccount)."""

    api: Any  # gpufleet.sandbox.kube.api.KubeApi
    policy: Policy
    status_file: Path | None = None
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    recent: list[tuple[float, str]] = field(default_factory=list)
    changed: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    last_notes: tuple[str, ...] = ()
    before_quarantine: tuple[str, ...] = ()  # argv; the node, fault and detection time are appended
    hook_timeout_s: float = HOOK_TIMEOUT_S

    def watch_nodes(self) -> None:
        """List, then watch from the list's resourceVersion; start over on any error (410 Gone
        included). Every change wakes the reconcile loop."""
        while not self.stop.is_set():
            try:
                data = self.api.get("/api/v1/nodes")
                with self.lock:
                    self.nodes = {n["metadata"]["name"]: n for n in data.get("items", [])}
                self.changed.set()
                rv = data["metadata"]["resourceVersion"]
                params = {"resourceVersion": rv, "allowWatchBookmarks": "true",
                          "timeoutSeconds": str(WATCH_SECONDS)}
                for ev in self.api.watch("/api/v1/nodes", params, WATCH_SECONDS + 30):
                    kind, obj = ev.get("type"), ev.get("object") or {}
                    if kind == "ERROR":
                        raise RuntimeError(f"watch error: {obj}")
                    if kind == "BOOKMARK":
                        continue
                    with self.lock:
                        if kind == "DELETED":
                            self.nodes.pop(obj["metadata"]["name"], None)
                        else:
                            self.nodes[obj["metadata"]["name"]] = obj
                    self.changed.set()
                    if self.stop.is_set():
                        return
            except Exception as e:
                logger.warning("node watch: %s; listing again", e)
                self.stop.wait(1.0)

    def reconcile(self, now: float) -> Decision:
        with self.lock:
            nodes = dict(self.nodes)
        views = [node_view(n) for n in nodes.values()]
        for v in views:  # after a restart, the breaker's history is in the annotations
            if v.quarantine is not None and (v.quarantine.at, v.name) not in self.recent:
                self.recent.append((v.quarantine.at, v.name))
        self.recent = [(t, n) for t, n in self.recent if now - t <= self.policy.window_s]
        d = decide(views, self.policy, self.recent, now)
        self._before_quarantine(d.quarantine, now)
        for name, finding in d.quarantine:
            if self._patch(name, quarantine_patch(nodes[name], finding, now, name in d.fence), "quarantine"):
                self.recent.append((now, name))
                logger.info("quarantined %s: %s (%s)", name, finding.fault, finding.why)
        quarantined_now = {n for n, _ in d.quarantine}
        for name in d.fence:
            if name not in quarantined_now and self._patch(name, fence_patch(nodes[name]), "fence"):
                logger.info("out-of-service taint on %s: its kubelet is lost", name)
        for name in d.release:
            if self._patch(name, release_patch(nodes[name]), "release"):
                logger.info("released %s: its problem cleared", name)
        notes = list(d.notes)
        for name in d.drain:
            notes += self._drain(name)
        if tuple(notes) != self.last_notes:
            for n in notes:
                logger.info("%s", n)
            self.last_notes = tuple(notes)
        self._write_status(nodes, d, notes, now)
        return d

    def _before_quarantine(self, quarantine: Sequence[tuple[str, Finding]], now: float) -> None:
        """Run the hook for every node about to be quarantined, at once; never longer than the bound."""
        if not self.before_quarantine or not quarantine:
            return
        env = {**os.environ, "GPUFLEET_BEFORE_DRAIN_DEADLINE": f"{now + self.hook_timeout_s:.3f}"}
        t0 = time.monotonic()
        procs = []
        for name, finding in quarantine:
            argv = [*self.before_quarantine, "--node", name, "--reason", finding.fault,
                    "--detected-at", f"{now:.3f}"]
            try:
                procs.append((name, subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                     stdin=subprocess.DEVNULL, env=env, text=True)))
            except OSError as e:
                logger.warning("before-quarantine hook for %s did not start: %s", name, e)
        deadline = t0 + self.hook_timeout_s
        for name, proc in procs:
            try:
                out, _ = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                logger.warning("before-quarantine hook for %s killed after %g s", name, self.hook_timeout_s)
                continue
            logger.info("before-quarantine hook for %s: exit %s after %.2f s: %s", name, proc.returncode,
                        time.monotonic() - t0, out.strip()[-300:])

    def _patch(self, node: str, body: dict[str, Any], what: str) -> bool:
        from gpufleet.sandbox.kube.api import ApiError

        resp = self.api.request("PATCH", f"/api/v1/nodes/{node}", body, STRATEGIC)
        if resp.status_code == 200:
            with self.lock:
                self.nodes[node] = resp.json()
            return True
        if resp.status_code == 409:  # changed under us: the next round decides again on the new object
            self.changed.set()
            return False
        logger.warning("%s", ApiError(f"{what} {node}", resp.status_code, resp.text))
        return False

    def _drain(self, node: str) -> list[str]:
        """Evict every evictable pod on the node; a 429 (a PDB allows no disruption now) is retried
        on the next round."""
        on_node = {"fieldSelector": f"spec.nodeName={node}"}
        pods = self.api.get("/api/v1/pods", params=on_node).get("items", [])
        notes = []
        for pod in pods:
            if not evictable(pod):
                continue
            name, ns = pod["metadata"]["name"], pod["metadata"]["namespace"]
            path = f"/api/v1/namespaces/{ns}/pods/{name}/eviction"
            resp = self.api.request("POST", path, eviction(name, ns))
            if resp.status_code in (200, 201):
                logger.info("evicted %s/%s from %s", ns, name, node)
            elif resp.status_code == 429:
                notes.append(f"{node}: eviction of {ns}/{name} refused for now (PodDisruptionBudget); "
                             "retrying")
            elif resp.status_code != 404:
                notes.append(f"{node}: eviction of {ns}/{name}: HTTP {resp.status_code}: {resp.text[:200]}")
        return notes

    def _write_status(self, nodes: Mapping[str, Mapping[str, Any]], d: Decision, notes: list[str],
                      now: float) -> None:
        if self.status_file is None:
            return
        quarantined = {}
        for name, n in nodes.items():
            q = node_view(n).quarantine
            if q is not None:
                quarantined[name] = q.fault
        status = RemediationStatus(pid=os.getpid(), mode=self.policy.mode, updated_at=now,
                                   quarantined=quarantined, breaker_open=d.breaker_open, notes=notes)
        tmp = self.status_file.with_suffix(".tmp")
        tmp.write_text(status.model_dump_json(indent=2))
        os.replace(tmp, self.status_file)

    def run(self) -> None:
        threading.Thread(target=self.watch_nodes, name="node-watch", daemon=True).start()
        while not self.stop.is_set():
            self.changed.wait(RESYNC_S)
            self.changed.clear()
            try:
                self.reconcile(time.time())
            except Exception as e:  # one bad round (the API server restarting) is logged, not fatal
                logger.warning("reconcile failed: %s", e)
                self.stop.wait(RESYNC_S)


def main(argv: Sequence[str] | None = None) -> int:
    from gpufleet.sandbox.kube.cluster import api_from_kubeconfig

    what = (__doc__ or "").split("\n")[0]
    p = argparse.ArgumentParser(prog="python -m gpufleet.sandbox.kube.remediation", description=what)
    p.add_argument("--kubeconfig", required=True, type=Path)
    p.add_argument("--policy", required=True, type=Path, help="the policy file `sandbox up` writes")
    p.add_argument("--status", type=Path, help="status file to rewrite after every reconcile")
    p.add_argument("--before-quarantine", default="", help="a command (shell words) run before a node is "
                   "quarantined, with --node N --reason FAULT --detected-at T appended; bounded by "
                   f"--hook-timeout (default {HOOK_TIMEOUT_S:g} s)")
    p.add_argument("--hook-timeout", type=float, default=HOOK_TIMEOUT_S)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    policy = load_policy(args.policy)
    with api_from_kubeconfig(args.kubeconfig, timeout=30) as api:
        hook = tuple(shlex.split(args.before_quarantine))
        ctl = Controller(api, policy, args.status, before_quarantine=hook, hook_timeout_s=args.hook_timeout)
        signal.signal(signal.SIGTERM, lambda *_: ctl.stop.set())
        logger.info("remediation: mode %s, circuit breaker %.0f%% of nodes in %g min", policy.mode,
                    policy.max_quarantined_share * 100, policy.window_s / 60)
        ctl.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
