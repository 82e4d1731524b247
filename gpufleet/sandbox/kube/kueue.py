"""Kueue in the Kubernetes sandbox: its configuration, identity and queues (pure manifests).

The sandbox runs Kueue's real controller manager (`sigs.k8s.io/kueue/cmd/kueue`, built by
`make kube-bins` at the version of its CRDs, tools/kube/versions.toml) as its own ServiceAccount,
bound to the ClusterRole controller-gen generates from Kueue's +kubebuilder:rbac markers, with a
configuration file (`configuration`). The training Job is submitted suspended with the
`kueue.x-k8s.io/queue-name` label of the stack's first queue; Kueue admits it as one Workload when
the ClusterQueue's GPU quota covers every pod (all or nothing: a gang) and unsuspends it.

Webhooks: Kueue serves them, but the sandbox registers no webhook configuration, because the API
server on loopback cannot reach them with a certificate it would trust:
- With Kueue's internal certificate management (the default, used here) the certificate names only
  `<webhookServiceName>.<namespace>.svc` (pkg/util/cert/cert.go), which the API server reaches
  through a Service; a Service here cannot lead to 127.0.0.1 (Endpoints and EndpointSlices refuse
  loopback addresses) and the rules keep sandbox traffic on loopback.
- Without it (`internalCertManagement.enable: false`, a certificate of the run's CA for 127.0.0.1
  and a webhook configuration by URL would work) v0.12.3's manager loads its metrics certificate
  from the fixed path /etc/kueue/metrics/certs (cmd/kueue/main.go) and exits without it: a file of
  the host outside the run directory, shared by every sandbox.
What that changes (docs/kubernetes-sandbox.md "Kueue"): no defaulting webhook suspends a Job that
carries the queue label, so the sandbox creates the training Job suspended itself (what the webhook
would have done); Kueue's objects are checked by their CRD schemas only, not by its validating
webhooks. Admission, quota and the gang are Kueue's controllers and scheduler, untouched.

Kueue's certificate controller (open-policy-agent/cert-controller) writes the webhook certificate
into the Secret it is configured with and waits until the files appear in its `certDir`, where a
kubelet would mount the Secret; the sandbox plays that kubelet (`mounted_files`).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import Any

from gpufleet.config.accelerators import accelerator_spec
from gpufleet.config.model import StackSpec
from gpufleet.config.placement import POOL_LABEL, pool_taints
from gpufleet.sandbox.kube.api import owned_by
from gpufleet.sandbox.kube.nodes import KwokNode
from gpufleet.sandbox.kube.rbac import MANAGED, namespace, role_ref

NAMESPACE = "kueue-system"  # Kueue's default namespace and the chart's (gpufleet.infra.charts)
SERVICE_ACCOUNT = "kueue-controller-manager"
WEBHOOK_SERVICE = "kueue-webhook-service"  # only part of the certificate's DNS name here
WEBHOOK_SECRET = "kueue-webhook-server-cert"
CERT_FILE, KEY_FILE = "tls.crt", "tls.key"  # cert-controller's keys in the Secret, file names in certDir
API = "kueue.x-k8s.io/v1beta1"
# What Kueue does not count (the Pulumi program's list, gpufleet.infra.scheduler.KUEUE_EXCLUDED_PREFIXES;
# a unit test holds the two equal): GPUs are what the queues ration.
EXCLUDED_PREFIXES = (
    "cpu",
    "memory",
    "ephemeral-storage",
    "hugepages-",
    "rdma/",
    "nvidia.com/hostdev",
    "vpc.amazonaws.com/efa",
)
# The sandbox runs Jobs only: the other integrations' CRDs (Kubeflow, Ray, JobSet...) are not there.
FRAMEWORKS = ("batch/job",)
CLIENT_QPS, CLIENT_BURST = 50, 100  # as the Pulumi program's configuration


def configuration(health_port: int, webhook_port: int, cert_dir: str) -> dict[str, Any]:
    """Kueue's Configuration file: the Pulumi program's (gang readiness, exclusions, client rate)
    on loopback ports, one instance (no leader election), no metrics server (nothing scrapes it
    here, and it would need the token review rights), no visibility server, batch/job only."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta1",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},  # controller-runtime: "0" turns the metrics server off
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": cert_dir},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {
            "enable": True,
            "webhookServiceName": WEBHOOK_SERVICE,
            "webhookSecretName": WEBHOOK_SECRET,
        },
        "manageJobsWithoutQueueName": False,
        "clientConnection": {"qps": CLIENT_QPS, "burst": CLIENT_BURST},
        "waitForPodsReady": {"enable": True, "timeout": "10m", "blockAdmission": True},
        "integrations": {"frameworks": list(FRAMEWORKS)},
        "resources": {"excludeResourcePrefixes": list(EXCLUDED_PREFIXES)},
        # Kueue's on-demand visibility API server (beta, on by default) would listen on 0.0.0.0:8082
        # and write its certificates to /visibility (pkg/visibility/server.go): off here.
        "featureGates": {"VisibilityOnDemand": False},
    }


def identity_objects(cluster_role: dict[str, Any]) -> list[dict[str, Any]]:
    """Kueue's namespace, ServiceAccount, the generated ClusterRole and its binding, and the empty
    Secret its certificate controller fills (it must exist: cert-controller only updates it)."""
    name = cluster_role["metadata"]["name"]
    role = {**cluster_role, "metadata": {"name": name, "labels": MANAGED}}
    subject = {"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}
    return [
        namespace(NAMESPACE, privileged=False),
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": SERVICE_ACCOUNT, "namespace": NAMESPACE, "labels": MANAGED},
            "automountServiceAccountToken": False,
        },
        role,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "labels": MANAGED},
            "roleRef": role_ref("ClusterRole", name),
            "subjects": [subject],
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": WEBHOOK_SECRET, "namespace": NAMESPACE, "labels": MANAGED},
            "type": "Opaque",
        },
    ]


def mounted_files(secret: dict[str, Any]) -> dict[str, bytes] | None:
    """The certificate files a kubelet would mount from the webhook Secret; None until Kueue's
    certificate controller has written both."""
    data = secret.get("data") or {}
    if not data.get(CERT_FILE) or not data.get(KEY_FILE):
        return None
    return {f: base64.b64decode(data[f]) for f in (CERT_FILE, KEY_FILE)}


def queue_name(spec: StackSpec) -> str:
    """The training Job's queue: the stack's first queue (the Pulumi program makes a ClusterQueue
    and a LocalQueue of that name when the stack's scheduler is Kueue)."""
    return spec.scheduler.queues[0].name


def quota_by_pool(spec: StackSpec, nodes: Iterable[KwokNode]) -> dict[str, int]:
    """GPUs of each pool as the sandbox made it (spares included, as the Pulumi program counts a
    pool's GPUs), capped at the queue's gpuQuota where the stack sets one."""
    gpus = {p.name: p.gpus_per_node for p in spec.node_pools}
    out: dict[str, int] = {}
    for n in nodes:
        out[n.pool] = out.get(n.pool, 0) + gpus[n.pool]
    cap = spec.scheduler.queues[0].gpu_quota
    return {pool: min(q, cap) if cap is not None else q for pool, q in out.items()}


def queue_objects(spec: StackSpec, nodes: Iterable[KwokNode], namespace_: str) -> list[dict[str, Any]]:
    """A ResourceFlavor per pool (its nodes' pool label, its taints tolerated), the ClusterQueue
    with one resource group per GPU resource and each pool a flavor sized by `quota_by_pool`, and
    the LocalQueue the training Job names."""
    quota = quota_by_pool(spec, nodes)
    pools = [p for p in spec.node_pools if p.name in quota]
    name = queue_name(spec)
    flavors = [
        {
            "apiVersion": API,
            "kind": "ResourceFlavor",
            "metadata": {"name": p.name, "labels": MANAGED},
            "spec": {
                "nodeLabels": {POOL_LABEL: p.name},
                "tolerations": [t.toleration() for t in pool_taints(p)],
            },
        }
        for p in pools
    ]
    by_resource: dict[str, list[str]] = {}
    for p in pools:
        by_resource.setdefault(accelerator_spec(p.accelerator).resource_name, []).append(p.name)
    groups = [
        {
            "coveredResources": [resource],
            "flavors": [
                {"name": pool, "resources": [{"name": resource, "nominalQuota": quota[pool]}]}
                for pool in members
            ],
        }
        for resource, members in sorted(by_resource.items())
    ]
    cq = {
        "apiVersion": API,
        "kind": "ClusterQueue",
        "metadata": {"name": name, "labels": MANAGED},
        "spec": {"namespaceSelector": {}, "queueingStrategy": "BestEffortFIFO", "resourceGroups": groups},
    }
    lq = {
        "apiVersion": API,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace_, "labels": MANAGED},
        "spec": {"clusterQueue": name},
    }
    return [*flavors, cq, lq]


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return None


def admitted(workload: dict[str, Any]) -> bool:
    c = condition(workload, "Admitted")
    return c is not None and c.get("status") == "True"


def workload_of_job(workloads: Iterable[dict[str, Any]], job_uid: str) -> dict[str, Any] | None:
    """The Workload Kueue made for a Job: the one the Job owns (ownerReferences)."""
    for w in workloads:
        if owned_by(w, job_uid):
            return w
    return None
