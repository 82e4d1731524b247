"""Kueue in the Kubernetes sandbox, the pure parts (gpufleet.sandbox.kube.kueue): its configuration
against the Pulumi program's, its identity, the queues sized from the sandbox's nodes, the Job
submitted suspended to the queue, the certificate a kubelet would mount, one version for the
controller and its CRDs. The real controller runs in tests/e2e/test_kubernetes_kueue.py."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from gpufleet.config import load_named_stack
from gpufleet.config.model import StackSpec
from gpufleet.core.errors import InputError
from gpufleet.infra import scheduler as infra
from gpufleet.sandbox.kube import daemons, kueue, rbac, workload
from gpufleet.sandbox.kube.nodes import plan_nodes
from gpufleet.sandbox.kube.versions import load_versions, parse_versions

STACKS = Path(__file__).parents[3] / "stacks"


@pytest.fixture(scope="module")
def sandbox_spec() -> StackSpec:
    return load_named_stack("sandbox", STACKS)


@pytest.fixture(scope="module")
def scale_spec() -> StackSpec:
    return load_named_stack("scale-10k", STACKS)


def test_configuration_is_the_pulumi_programs_on_loopback() -> None:
    cfg = kueue.configuration(20001, 20002, "/run/x/kueue/certs")
    deployed = infra.kueue_configuration()
    # What decides admission is the deployed platform's.
    for key in ("waitForPodsReady", "resources", "clientConnection", "apiVersion", "kind"):
        assert cfg[key] == deployed[key], key
    assert kueue.EXCLUDED_PREFIXES == infra.KUEUE_EXCLUDED_PREFIXES
    assert set(kueue.FRAMEWORKS) <= set(infra.KUEUE_FRAMEWORKS)
    # What differs, on purpose: loopback ports, one instance, no metrics, the certificate's folder.
    assert cfg["health"] == {"healthProbeBindAddress": "127.0.0.1:20001"}
    assert cfg["webhook"] == {"host": "127.0.0.1", "port": 20002, "certDir": "/run/x/kueue/certs"}
    assert cfg["metrics"] == {"bindAddress": "0"}
    assert cfg["leaderElection"] == {"leaderElect": False}
    assert cfg["internalCertManagement"]["enable"] is True
    assert cfg["internalCertManagement"]["webhookSecretName"] == kueue.WEBHOOK_SECRET
    assert cfg["manageJobsWithoutQueueName"] is False
    assert cfg["featureGates"] == {"VisibilityOnDemand": False}  # it would listen on 0.0.0.0:8082


def test_kueue_argv_and_readiness(tmp_path: Path) -> None:
    ports = {name: 21000 + i for i, name in enumerate(daemons.PORT_NAMES)}
    lay = daemons.KubeLayout("s", "abc", tmp_path / "run-abc", ports)
    argv = daemons.kueue_argv(Path("/cache/kueue-v0.12.3/bin/kueue"), lay)
    assert argv == [
        "/cache/kueue-v0.12.3/bin/kueue",
        f"--config={lay.kueue_config}",
        f"--kubeconfig={lay.kubeconfig('kueue')}",
    ]
    assert lay.healthz_url(daemons.KUEUE) == f"http://127.0.0.1:{ports['kueue-health']}/readyz"
    assert str(lay.base_dir) in str(lay.kueue_cert_dir)


def test_identity_binds_the_generated_role_to_kueues_service_account() -> None:
    generated = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "gpufleet-kueue"},
        "rules": [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "update"]}],
    }
    objs = kueue.identity_objects(rbac.cluster_role([None, generated]))
    kinds = [o["kind"] for o in objs]
    assert kinds == ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Secret"]
    role, binding, secret = objs[2], objs[3], objs[4]
    assert role["rules"] == generated["rules"]
    assert binding["roleRef"]["name"] == "gpufleet-kueue"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": kueue.SERVICE_ACCOUNT, "namespace": kueue.NAMESPACE}
    ]
    assert secret["metadata"] == {
        "name": kueue.WEBHOOK_SECRET,
        "namespace": kueue.NAMESPACE,
        "labels": secret["metadata"]["labels"],
    }
    assert "data" not in secret  # Kueue's certificate controller fills it
    with pytest.raises(ValueError, match="found 0"):
        rbac.cluster_role([{"kind": "Role"}])


def test_mounted_files_wait_for_both_keys() -> None:
    assert kueue.mounted_files({"metadata": {}}) is None
    assert kueue.mounted_files({"data": {"tls.crt": base64.b64encode(b"c").decode()}}) is None
    data = {"tls.crt": base64.b64encode(b"CERT").decode(), "tls.key": base64.b64encode(b"KEY").decode()}
    files = kueue.mounted_files({"data": data})
    assert files == {"tls.crt": b"CERT", "tls.key": b"KEY"}


def test_queues_sized_from_the_sandbox_nodes(sandbox_spec: StackSpec) -> None:
    nodes = plan_nodes(sandbox_spec, 3)  # 2 compute + 1 spare of 8 GPUs
    objs = kueue.queue_objects(sandbox_spec, nodes, workload.TRAINING_NAMESPACE)
    flavors = [o for o in objs if o["kind"] == "ResourceFlavor"]
    pool = sandbox_spec.node_pools[0]
    assert [f["metadata"]["name"] for f in flavors] == [pool.name]
    assert flavors[0]["spec"] == infra.resource_flavor_spec(pool, topology=False)
    cq = next(o for o in objs if o["kind"] == "ClusterQueue")
    lq = next(o for o in objs if o["kind"] == "LocalQueue")
    gpus = 3 * pool.gpus_per_node
    name = sandbox_spec.scheduler.queues[0].name
    assert cq["metadata"]["name"] == name == lq["metadata"]["name"] == lq["spec"]["clusterQueue"]
    assert lq["metadata"]["namespace"] == infra.QUEUE_NAMESPACE
    assert cq["spec"]["resourceGroups"] == [
        {
            "coveredResources": ["nvidia.com/gpu"],
            "flavors": [
                {"name": pool.name, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": gpus}]}
            ],
        }
    ]


def test_queue_at_full_size_is_the_pulumi_programs(scale_spec: StackSpec) -> None:
    """With every node of every pool, the ClusterQueue is what the Pulumi program declares."""
    objs = kueue.queue_objects(scale_spec, plan_nodes(scale_spec), "default")
    cq = next(o for o in objs if o["kind"] == "ClusterQueue")
    assert cq["spec"] == infra.cluster_queue_spec(scale_spec.scheduler.queues[0], scale_spec.node_pools)


def test_queue_quota_capped_by_the_stacks_gpu_quota(sandbox_spec: StackSpec) -> None:
    queues = [sandbox_spec.scheduler.queues[0].model_copy(update={"gpu_quota": 8})]
    spec = sandbox_spec.model_copy(
        update={"scheduler": sandbox_spec.scheduler.model_copy(update={"queues": queues})}
    )
    assert kueue.quota_by_pool(spec, plan_nodes(spec, 3)) == {spec.node_pools[0].name: 8}


def test_training_job_submitted_suspended_to_the_queue(sandbox_spec: StackSpec) -> None:
    plan = workload.training_plan(sandbox_spec, 2)
    plain = workload.training_job(sandbox_spec, plan)
    assert "suspend" not in plain["spec"]
    assert workload.QUEUE_LABEL not in plain["metadata"]["labels"]
    queued = workload.training_job(sandbox_spec, plan, "train")
    assert queued["spec"]["suspend"] is True
    assert queued["metadata"]["labels"][workload.QUEUE_LABEL] == "train"
    assert workload.QUEUE_LABEL == infra.QUEUE_LABEL
    # The pods are the same: Kueue adds the flavor's node labels when it admits the Job.
    assert queued["spec"]["template"] == plain["spec"]["template"]


def test_workload_of_job_and_admitted() -> None:
    conditions = [{"type": "QuotaReserved", "status": "True"}]
    wl: dict[str, Any] = {
        "metadata": {"name": "job-x", "ownerReferences": [{"kind": "Job", "uid": "u1"}]},
        "status": {"conditions": conditions},
    }
    assert kueue.workload_of_job([wl], "u1") is wl
    assert kueue.workload_of_job([wl], "u2") is None
    assert not kueue.admitted(wl)
    conditions.append({"type": "Admitted", "status": "True"})
    assert kueue.admitted(wl)


def test_one_version_for_the_controller_and_its_crds() -> None:
    versions = load_versions()
    crds = next(s for s in versions.crds if s.name == "kueue")
    assert versions.component("kueue").version == crds.version
    assert versions.component("kueue").group == "kube"  # make kube-bins builds it, up needs it
    assert crds.rbac is not None and crds.rbac.role == "gpufleet-kueue"
    assert crds.rbac.argv("/out") == [
        "rbac:roleName=gpufleet-kueue",
        "paths=./pkg/controller/...;./pkg/webhooks/...;./pkg/util/cert/...;./pkg/visibility/...",
        "output:rbac:dir=/out",
    ]


def test_rbac_generator_entry_is_checked() -> None:
    base = {
        "components": {
            "kueue": {"module": "sigs.k8s.io/kueue", "version": "v0.12.3", "dir": "kueue",
                      "binaries": {"kueue": "sigs.k8s.io/kueue/cmd/kueue"}}
        },
        "crds": {
            "kueue": {
                "module": "sigs.k8s.io/kueue",
                "version": "v0.12.3",
                "chart": "kueue",
                "packages": ["./apis/kueue/v1beta1"],
                "options": "crd",
                "rbac": {"role": "Bad_Name", "packages": ["../outside"], "extra": 1},
            }
        },
    }
    with pytest.raises(InputError) as err:
        parse_versions(base)
    where = {p.path for p in err.value.problems}
    assert {"crds.kueue.rbac.role", "crds.kueue.rbac.packages", "crds.kueue.rbac.extra"} <= where
