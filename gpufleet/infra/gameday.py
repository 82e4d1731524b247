"""The scheduled game-day: a CronJob running `gpufleet gameday --stack <s> --backend kubernetes`
under its own ServiceAccount whose ClusterRole can do exactly what the Kubernetes chaos backend
does (read and cordon/taint nodes, read pods, evict pods) and nothing else: in particular it cannot
read Secrets (the JuiceFS credentials live in one).

The job reads the stack from a ConfigMap copy of the stack file with every secret value replaced by
a marker: the game-day needs the topology and budgets, never credentials.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import yaml

from gpufleet.config import StackSpec
from gpufleet.core.ledger_location import LEDGER_CONFIGMAP, configmap_ledger
from gpufleet.infra.common import MANAGED_BY, child

REDACTED = {"secure": "redacted-by-gpufleet"}
WORKDIR = "/etc/gpufleet"
FAULT_POD_ROLE = "gpufleet-gameday-fault-pods"  # a Role in the game-day namespace


@dataclass(frozen=True)
class GamedayArgs:
    spec: StackSpec
    stack_name: str


def gameday_rbac_rules() -> list[dict[str, Any]]:
    """The ClusterRole's rules: least privilege for the Kubernetes chaos backend on real nodes (the
    node-status and Lease permissions its simulated-node faults need are the Kubernetes sandbox's
    only, gpufleet/sandbox/kube/rbac.py: a real node's condition and Lease belong to its kubelet)."""
    return [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        # The training Job's parallelism (gpufleet_k8s_training_job): the workload's pods it needs.
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get"]},
    ]


def gameday_namespace_rules() -> list[dict[str, Any]]:
    """The Role's rules in the game-day namespace: the backend's fault pods (a GPU injection, a link
    down, a node crash on a real node) are created there and deleted by their rollbacks; the fault
    ledger's ConfigMap is created there, then read and patched by its name only (RBAC cannot
    narrow `create` to a name)."""
    return [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "delete"]},
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [LEDGER_CONFIGMAP],
         "verbs": ["get", "patch"]},
    ]


def rules_allow(
    rules: list[dict[str, Any]], verb: str, resource: str, group: str = "", name: str | None = None
) -> bool:
    """Whether RBAC rules grant `verb` on `resource` (wildcards included), as the API server
    evaluates a PolicyRule: a rule with resourceNames grants only requests for one of them."""
    for r in rules:
        groups, resources, verbs = r.get("apiGroups", []), r.get("resources", []), r.get("verbs", [])
        names = r.get("resourceNames") or []
        if (
            (group in groups or "*" in groups)
            and (resource in resources or "*" in resources)
            and (verb in verbs or "*" in verbs)
            and (not names or name in names)
        ):
            return True
    return False


def _redact(value: Any) -> Any:
    if isinstance(value, dict):
        if value and set(value) <= {"secure", "plain"}:
            return dict(REDACTED)
        return {k: _redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v) for v in value]
    return value


def stack_document(spec: StackSpec) -> str:
    """The stack as a stack file (`config: {gpufleet:<key>: ...}`) with secrets redacted."""
    data = _redact(spec.model_dump(mode="json", by_alias=True, exclude_none=True))
    return yaml.safe_dump({"config": {f"gpufleet:{k}": v for k, v in data.items()}}, sort_keys=True)


def cronjob_spec(spec: StackSpec, stack_name: str, service_account: str, config_map: str) -> dict[str, Any]:
    gd = spec.gameday
    return {
        "schedule": gd.schedule,
        "concurrencyPolicy": "Forbid",  # two game-days at once would double the blast radius
        "startingDeadlineSeconds": 3600,
        "successfulJobsHistoryLimit": 3,
        "failedJobsHistoryLimit": 5,
        "jobTemplate": {
            "spec": {
                "backoffLimit": 0,  # a failed game-day is a finding, not something to retry blindly
                "template": {
                    "spec": {
                        "serviceAccountName": service_account,
                        "restartPolicy": "Never",
                        "securityContext": {
                            "runAsNonRoot": True,
                            "runAsUser": 65532,
                            "seccompProfile": {"type": "RuntimeDefault"},
                        },
                        "containers": [
                            {
                                "name": "gameday",
                                "image": gd.image,
                                "workingDir": WORKDIR,
                                "command": [
                                    "gpufleet",
                                    "gameday",
                                    "--stack",
                                    stack_name,
                                    "--backend",
                                    "kubernetes",
                                ],
                                "securityContext": {
                                    "allowPrivilegeEscalation": False,
                                    "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]},
                                },
                                # The fault ledger outlives the pod (its emptyDir does not): the
                                # next game-day, or `gpufleet chaos revert`, undoes what a killed
                                # pod left (gpufleet.chaos.backends.kube_ledger).
                                "env": [{"name": "GPUFLEET_LEDGER",
                                         "value": configmap_ledger(gd.namespace)}],
                                "volumeMounts": [
                                    {"name": "stack", "mountPath": f"{WORKDIR}/stacks", "readOnly": True},
                                    {"name": "reports", "mountPath": f"{WORKDIR}/reports"},
                                    {"name": "tmp", "mountPath": "/tmp"},
                                ],
                            }
                        ],
                        "volumes": [
                            {"name": "stack", "configMap": {"name": config_map}},
                            {"name": "reports", "emptyDir": {}},
                            {"name": "tmp", "emptyDir": {}},
                        ],
                    }
                },
            }
        },
    }


class GamedaySchedule(pulumi.ComponentResource):
    def __init__(self, name: str, args: GamedayArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpufleet:gameday:GamedaySchedule", name, None, opts)
        gd = args.spec.gameday
        ns = k8s.core.v1.Namespace(
            f"{name}-ns", metadata={"name": gd.namespace, "labels": MANAGED_BY}, opts=child(self)
        )
        namespace = ns.metadata.apply(lambda m: m.name)
        sa = k8s.core.v1.ServiceAccount(
            f"{name}-sa",
            metadata={"name": "gpufleet-gameday", "namespace": namespace, "labels": MANAGED_BY},
            opts=child(self),
        )
        self.role = k8s.rbac.v1.ClusterRole(
            f"{name}-role",
            metadata={"name": "gpufleet-gameday", "labels": MANAGED_BY},
            rules=gameday_rbac_rules(),
            opts=child(self),
        )
        k8s.rbac.v1.ClusterRoleBinding(
            f"{name}-binding",
            metadata={"name": "gpufleet-gameday", "labels": MANAGED_BY},
            role_ref={
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "gpufleet-gameday",
            },
            subjects=[{"kind": "ServiceAccount", "name": "gpufleet-gameday", "namespace": gd.namespace}],
            opts=child(self, [self.role, sa]),
        )
        pods_role = k8s.rbac.v1.Role(
            f"{name}-fault-pods",
            metadata={"name": FAULT_POD_ROLE, "namespace": namespace, "labels": MANAGED_BY},
            rules=gameday_namespace_rules(),
            opts=child(self),
        )
        k8s.rbac.v1.RoleBinding(
            f"{name}-fault-pods-binding",
            metadata={"name": FAULT_POD_ROLE, "namespace": namespace, "labels": MANAGED_BY},
            role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": FAULT_POD_ROLE},
            subjects=[{"kind": "ServiceAccount", "name": "gpufleet-gameday", "namespace": gd.namespace}],
            opts=child(self, [pods_role, sa]),
        )
        cm = k8s.core.v1.ConfigMap(
            f"{name}-stack",
            metadata={"name": "gpufleet-stack", "namespace": namespace, "labels": MANAGED_BY},
            data={f"Pulumi.{args.stack_name}.yaml": stack_document(args.spec)},
            opts=child(self),
        )
        self.cronjob = k8s.batch.v1.CronJob(
            f"{name}-cronjob",
            metadata={"name": "gpufleet-gameday", "namespace": namespace, "labels": MANAGED_BY},
            spec=cronjob_spec(args.spec, args.stack_name, "gpufleet-gameday", "gpufleet-stack"),
            opts=child(self, [sa, cm]),
        )
        self.register_outputs({"schedule": gd.schedule, "namespace": gd.namespace})
