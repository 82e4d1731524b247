"""Jobs that excluded a node (pure): the lemon rule's second signal (lemon.py; Meta counts the
jobs whose users excluded a node, Kokolis et al. HPCA 2025).

Slurm: read from `scontrol -o show job` (ExcNodeList, SubmitTime), which keeps a finished job for
MinJobAge seconds; a cluster with accounting would read `sacct -X -P -o JobID,ExcNodeList,Submit`
for the whole week instead.

Kubernetes has no exclude list; a job keeps off named nodes with a required node affinity
`kubernetes.io/hostname NotIn [...]` (or `matchFields` on `metadata.name`), which every pod of
the job carries (Kubernetes docs, "Assigning Pods to Nodes": node affinity). A job is the pods'
controller (ownerReference with controller: true; a bare pod is its own job), counted once, when
its earliest listed pod was created after the node's previous sweep. Pods are read from the API
server, which keeps a finished pod until its job's TTL or the pod garbage collector removes it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from gpufleet.core.slurm_state import expand_hostlist, parse_slurm_time


def job_exclusions(scontrol_jobs: str, since: Mapping[str, float], default_since: float = 0.0
                   ) -> dict[str, int]:
    """Per node, the jobs submitted after `since[node]` (its previous sweep) whose ExcNodeList
    names it; every job is counted once per node, so sweeps never count one job twice."""
    out: Counter[str] = Counter()
    for line in scontrol_jobs.splitlines():
        kv = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        exc = kv.get("ExcNodeList", "")
        if not exc or exc == "(null)":
            continue
        submitted = parse_slurm_time(kv.get("SubmitTime", ""))
        if submitted is None:
            continue
        for node in expand_hostlist(exc):
            if submitted > since.get(node, default_since):
                out[node] += 1
    return dict(out)


HOSTNAME_LABEL = "kubernetes.io/hostname"  # well-known label: the node's hostname


def _term_excludes(term: Mapping[str, Any], host_to_node: Mapping[str, str]) -> set[str]:
    """Nodes one node-selector term rules out by name (its requirements are ANDed, so any NotIn)."""
    out: set[str] = set()
    for e in term.get("matchExpressions") or []:
        if e.get("key") == HOSTNAME_LABEL and e.get("operator") == "NotIn":
            out.update(host_to_node.get(v, v) for v in e.get("values") or [])
    for e in term.get("matchFields") or []:
        if e.get("key") == "metadata.name" and e.get("operator") == "NotIn":
            out.update(e.get("values") or [])
    return out


def pod_excludes(pod: Mapping[str, Any], host_to_node: Mapping[str, str]) -> set[str]:
    """Nodes a pod's required node affinity rules out by name. Its terms are ORed, so a node is
    ruled out only when every term rules it out; a preferred (soft) affinity excludes nothing."""
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return set()
    out = _term_excludes(terms[0], host_to_node)
    for term in terms[1:]:
        out &= _term_excludes(term, host_to_node)
    return out


def _job_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller"):
            return f"{ref.get('kind')}/{ref.get('uid') or ref.get('name')}"
    return f"Pod/{meta.get('uid') or meta.get('namespace', '')}/{meta.get('name')}"


def _created(pod: Mapping[str, Any]) -> float | None:
    text = (pod.get("metadata") or {}).get("creationTimestamp")
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def pod_exclusions(pods: Sequence[Mapping[str, Any]], nodes: Sequence[Mapping[str, Any]],
                   since: Mapping[str, float], default_since: float = 0.0) -> dict[str, int]:
    """Per node, the jobs (pod controllers) created after `since[node]` whose pods' required node
    affinity rules the node out by name; each job counted once per node."""
    host_to_node = {str(labels[HOSTNAME_LABEL]): str(n["metadata"]["name"]) for n in nodes
                    if HOSTNAME_LABEL in (labels := (n.get("metadata") or {}).get("labels") or {})}
    jobs: dict[str, tuple[float, set[str]]] = {}
    for p in pods:
        created = _created(p)
        excluded = pod_excludes(p, host_to_node)
        if created is None or not excluded:
            continue
        key = _job_key(p)
        first, names = jobs.get(key, (created, set()))
        jobs[key] = (min(first, created), names | excluded)
    out: Counter[str] = Counter()
    for first, names in jobs.values():
        for node in names:
            if first > since.get(node, default_since):
                out[node] += 1
    return dict(out)
