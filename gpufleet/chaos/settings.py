"""What an experiment's `configuration` says to the extension, parsed once, validated at the edge.

Every key is optional except where an activity needs it; CONFIG_KEYS below lists them with their
meaning (`chaos discover gpufleet` shows the same list, `gpufleet chaos validate` checks against it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaoslib.exceptions import InvalidActivity

from gpufleet.core.ledger_location import configmap_location
from gpufleet.slo import parse_budget_override

DEFAULT_LEDGER = "/var/lib/gpufleet/ledger/faults.jsonl"
BACKENDS = ("sandbox", "slurm", "kubernetes", "storage")
# Every configuration key the extension reads, with what it means: `chaos discover gpufleet` lists
# them (extension.configuration) and `gpufleet chaos validate` rejects other gpufleet_* keys.
CONFIG_KEYS: dict[str, str] = {
    "gpufleet_backend": "sandbox | slurm | kubernetes | storage (default: the stack's gameday.backend)",
    "gpufleet_stack": "stack name, read from <gpufleet_stacks_dir>/Pulumi.<stack>.yaml",
    "gpufleet_stacks_dir": "folder of the stack files (default: $GPUFLEET_STACKS_DIR, which `gpufleet "
    "gameday --stacks-dir` sets for its runs, else stacks, relative to the working directory)",
    "gpufleet_fault_class": "the fault class whose budget in the stack judges this experiment",
    "gpufleet_budget_override": "{detect_seconds, isolate_seconds, recover_seconds} (or the stack file's "
    "detectSeconds, ...): replaces the stack's budget key by key (a breach test sets it too tight "
    "on purpose)",
    "gpufleet_dry_run": "true: record and print every fault, apply nothing",
    "gpufleet_allow_production": "true: needed to inject into a stack whose cluster.environment is "
    "production",
    "gpufleet_ledger": "the fault ledger: a file path, or configmap://<namespace>/<name> for a ConfigMap "
    "of the cluster the kubernetes backend injects into (else $GPUFLEET_LEDGER, else " + DEFAULT_LEDGER + ")",
    "gpufleet_catalog_dir": "an extended fault catalog directory (default: the packaged one)",
    "gpufleet_ssh": "slurm backend: ssh argv prefix (default: ssh -o BatchMode=yes -o ConnectTimeout=5)",
    "gpufleet_fabric_ifname": "slurm/kubernetes: host netdev of rail {rail} (default: ib{rail})",
    "gpufleet_k8s_namespace": "kubernetes: namespace of the fault pods (default: the stack's "
    "gameday.namespace)",
    "gpufleet_k8s_image": "kubernetes: fault pod image (default: the stack's gameday.image)",
    "gpufleet_k8s_host": "kubernetes: API server URL (else the stack's Kubernetes sandbox when one is up, "
    "else kubeconfig / in-cluster config)",
    "gpufleet_kubeconfig": "kubernetes: which kubeconfig file (default: the Kubernetes sandbox's chaos "
    "kubeconfig when the stack has one up)",
    "gpufleet_k8s_training_job": "kubernetes: <namespace>/<name> of the training Job whose pods are the "
    "workload (default: the Kubernetes sandbox's)",
    "gpufleet_k8s_context": "kubernetes: which kubeconfig context",
    "gpufleet_serving_url": "slurm/kubernetes: the serving workload's load balancer (http://HOST:PORT) that "
    "the serving load drives (the sandbox names its own)",
    "gpufleet_prometheus_url": "slurm/kubernetes: Prometheus base URL (the sandbox names its own)",
    "gpufleet_sandbox_root": "sandbox: state root (else $GPUFLEET_SANDBOX_ROOT, else "
    "/run/gpufleet/sandboxes)",
    "gpufleet_run": "set by the run itself (the gpufleet-safety control, else the first activity): "
    "this run's id in the ledger; do not set it",
}
RUN_KEY = "gpufleet_run"
KNOWN_KEYS = frozenset(CONFIG_KEYS)


def ledger_location(configuration: Mapping[str, Any] | None = None) -> str:
    """Where the fault ledger is: a file path, or configmap://<namespace>/<name> (kept as text: a
    Path would fold the scheme's `//`)."""
    cfg = configuration or {}
    return str(cfg.get("gpufleet_ledger") or os.environ.get("GPUFLEET_LEDGER") or DEFAULT_LEDGER)


def _bool(cfg: Mapping[str, Any], key: str, problems: list[str]) -> bool:
    v = cfg.get(key, False)
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "false", "1", "0", "yes", "no"):
        return v.lower() in ("true", "1", "yes")
    problems.append(f"{key} must be true or false (got {v!r})")
    return False


@dataclass(frozen=True)
class Settings:
    backend: str | None
    stack: str | None
    stacks_dir: Path
    fault_class: str | None
    budget_override: dict[str, float] | None
    dry_run: bool
    allow_production: bool
    ledger: str  # ledger_location
    catalog_dir: Path | None
    ssh: tuple[str, ...]
    fabric_ifname: str
    k8s_namespace: str | None
    k8s_image: str | None
    k8s_host: str | None = None
    kubeconfig: str | None = None
    k8s_context: str | None = None
    k8s_training_job: tuple[str, str] | None = None
    prometheus_url: str | None = None
    serving_url: str | None = None
    sandbox_root: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def stacks_dir_of(cfg: Mapping[str, Any]) -> Path:
    """An experiment names its stack, rarely the folder: the game-day's --stacks-dir reaches its
    `chaos run`s by the environment (chaoslib's --var overrides only keys an experiment declares)."""
    return Path(str(cfg.get("gpufleet_stacks_dir") or os.environ.get("GPUFLEET_STACKS_DIR") or "stacks"))


def parse_settings(configuration: Mapping[str, Any] | None) -> Settings:
    """Validate the gpufleet_* keys; every problem at once (InvalidActivity)."""
    cfg = dict(configuration or {})
    problems: list[str] = [
        f"unknown key {k!r} (known: {', '.join(sorted(KNOWN_KEYS))})"
        for k in sorted(cfg)
        if k.startswith("gpufleet_") and k not in KNOWN_KEYS
    ]
    backend = cfg.get("gpufleet_backend")
    if backend is not None and backend not in BACKENDS:
        problems.append(f"gpufleet_backend must be one of {', '.join(BACKENDS)} (got {backend!r})")
    override = cfg.get("gpufleet_budget_override")
    budget: dict[str, float] | None = None
    if override is not None:
        try:  # the one parser the game-day's judge uses too (snake_case or camelCase keys)
            budget = parse_budget_override(override)
        except ValueError as e:
            problems.append(str(e))
    ssh = cfg.get("gpufleet_ssh", ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5"])
    if not (isinstance(ssh, list) and ssh and all(isinstance(x, str) for x in ssh)):
        problems.append("gpufleet_ssh must be a non-empty list of strings")
        ssh = ["ssh"]
    job = cfg.get("gpufleet_k8s_training_job")
    training_job: tuple[str, str] | None = None
    if job is not None:
        ns, _, name = str(job).partition("/")
        if not (isinstance(job, str) and ns and name and "/" not in name):
            problems.append(f"gpufleet_k8s_training_job must be <namespace>/<name> (got {job!r})")
        else:
            training_job = (ns, name)
    serving_url = cfg.get("gpufleet_serving_url")
    if serving_url is not None and not (isinstance(serving_url, str) and serving_url.startswith("http://")):
        problems.append(f"gpufleet_serving_url must be http://HOST:PORT (got {serving_url!r})")
    dry = _bool(cfg, "gpufleet_dry_run", problems)
    prod = _bool(cfg, "gpufleet_allow_production", problems)
    ledger = ledger_location(cfg)
    try:  # its backend is checked once it is known (engine.context: the stack may name it)
        configmap_location(ledger)
    except ValueError as e:
        problems.append(str(e))
    if problems:
        raise InvalidActivity("invalid gpufleet configuration: " + "; ".join(problems))
    catalog_dir = cfg.get("gpufleet_catalog_dir")
    return Settings(
        backend=backend,
        stack=cfg.get("gpufleet_stack"),
        stacks_dir=stacks_dir_of(cfg),
        fault_class=cfg.get("gpufleet_fault_class"),
        budget_override=budget,
        dry_run=dry,
        allow_production=prod,
        ledger=ledger,
        catalog_dir=Path(catalog_dir) if catalog_dir else None,
        ssh=tuple(ssh),
        fabric_ifname=str(cfg.get("gpufleet_fabric_ifname", "ib{rail}")),
        k8s_namespace=cfg.get("gpufleet_k8s_namespace"),
        k8s_image=cfg.get("gpufleet_k8s_image"),
        k8s_host=cfg.get("gpufleet_k8s_host"),
        kubeconfig=cfg.get("gpufleet_kubeconfig"),
        k8s_context=cfg.get("gpufleet_k8s_context"),
        k8s_training_job=training_job,
        prometheus_url=cfg.get("gpufleet_prometheus_url"),
        serving_url=serving_url,
        sandbox_root=Path(cfg["gpufleet_sandbox_root"]) if cfg.get("gpufleet_sandbox_root") else None,
        extra={k: v for k, v in cfg.items() if not k.startswith("gpufleet_")},
    )
