"""End-to-end: every shipped stack deployed by the real Pulumi CLI to a real API server.

For each stack in stacks/: a Kubernetes sandbox of that stack (`gpufleet sandbox up --kubernetes
--cluster-only`: real etcd, kube-apiserver, controller manager and scheduler, the generated CRDs,
kwok nodes named and sized as the stack's pools plus its Ceph storage nodes), then, with the CLI
`make pulumi-bins` builds and the project's policy pack (`--policy-pack`): `pulumi preview`,
`pulumi up`, everything read back from the API server, a second `pulumi up` that must change
nothing (`--expect-no-changes`), `pulumi refresh` (also without changes), `pulumi destroy`, and
what destroy must leave (retained objects) or take away (everything else, the node patches'
fields).

No chart repository can be reached, so the stack copy sets `gpufleet:charts.source: disabled`: the
program declares no Helm release and names each in its `leftOut` output, and leaves out the custom
resources whose CRD the sandbox cannot serve (the Network Operator's: tools/kube/versions.toml
[unavailable.network-operator]; AMD's DeviceConfig: no CRD source); with the NicClusterPolicy
left out, the pack's `nccl-env-matches-fabric` must report it, so it runs as advisory there and its
message is asserted.

Stack-specific steps: b200-roce (Kueue, topology) changes a pool taint on a further `up` (the
ResourceFlavor, immutable with a topologyName, is replaced); sandbox runs the game-day CronJob every
minute, waits for the controller manager's Job, and checks its ServiceAccount with `kubectl auth
can-i` against the real RBAC. scale-10k runs at a tenth of its nodes unless
GPUFLEET_E2E_FULL_SCALE=1 (SCALED_IN_E2E: why).

Needs `make kube-bins` and `make pulumi-bins` (`make test` builds both); no root.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_support import gpufleet, wait_until
from kubernetes import client, config, dynamic
from kubernetes.dynamic.exceptions import NotFoundError, ResourceNotFoundError, UnprocessibleEntityError

from gpufleet.config import StackSpec, collective_environment, load_named_stack
from gpufleet.config.model import ChartSource, ChartsSpec
from gpufleet.core.sandbox_contract import KubeSandboxState, read_kube_state
from gpufleet.infra.discovery import served_kinds
from gpufleet.infra.gameday import gameday_namespace_rules, gameday_rbac_rules
from gpufleet.infra.offline import run_offline
from gpufleet.infra.platform import vendors
from gpufleet.sandbox.kube import require_kube_paths
from gpufleet.sandbox.kube.nodes import plan_nodes, plan_storage_nodes
from gpufleet.sandbox.pulumi_cli import require_pulumi_paths
from gpufleet.sandbox.pulumi_project import PulumiProject, policy_pack_copy, sandbox_project

pytestmark = pytest.mark.sandbox

REPO = Path(__file__).resolve().parents[2]
STACKS = sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in (REPO / "stacks").glob("Pulumi.*.yaml"))
RELEASE = "kubernetes:helm.sh/v3:Release"
PATCH_SUFFIX = "Patch"
PULUMI_MANAGER = "pulumi-kubernetes"  # the provider's field manager names start so
GAMEDAY_SA = "gpufleet-gameday"
EVERY_MINUTE = "* * * * *"
NCCL_POLICY = "nccl-env-matches-fabric"


@dataclass(frozen=True)
class Deployment:
    stack: str
    spec: StackSpec
    state: KubeSandboxState
    project: PulumiProject
    policy: list[str]  # the --policy-pack arguments
    dyn: dynamic.DynamicClient
    kubectl: Path


def fail_text(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"


@pytest.fixture(scope="module")
def built() -> tuple[Path, Any]:
    try:
        kube = require_kube_paths(unused=frozenset({"kueue"}))  # --cluster-only starts no Kueue
        return kube.binaries["kubectl"], require_pulumi_paths()
    except RuntimeError as e:
        pytest.fail(str(e))  # `make test` builds them first: missing is a failure, not a skip


# scale-10k's full 1,280 nodes cost the e2e tier about half an hour on a busy 2-core machine (one
# NodePatch per node, each a server-side apply; docs/pulumi.md "Measured"): the tier runs it at a
# tenth of its nodes, the same program and structure (one pool, leaf groups of 32, Volcano with
# HyperNodes, JuiceFS), and GPUFLEET_E2E_FULL_SCALE=1 runs it whole; benchmarks/pulumi_up.py times
# preview and up at the full size.
SCALED_IN_E2E = {"scale-10k": 10}


def scaled_stacks_dir(stack: str, dest: Path) -> Path:
    """The folder of the stack file the test uses: the repository's, or for a stack in
    SCALED_IN_E2E (unless GPUFLEET_E2E_FULL_SCALE=1) a copy whose pools have 1/divisor of their
    nodes and spares (ciphertext and salt kept)."""
    divisor = SCALED_IN_E2E.get(stack)
    if divisor is None or os.environ.get("GPUFLEET_E2E_FULL_SCALE") == "1":
        return REPO / "stacks"
    doc = yaml.safe_load((REPO / "stacks" / f"Pulumi.{stack}.yaml").read_text())
    for pool in doc["config"]["gpufleet:nodePools"]:
        pool["nodes"] = max(1, round(pool["nodes"] / divisor))
        pool["spares"] = max(1 if pool["spares"] else 0, round(pool["spares"] / divisor))
    dest.mkdir(parents=True, exist_ok=True)
    (dest / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return dest


def charts_disabled(spec: StackSpec) -> StackSpec:
    return spec.model_copy(update={"charts": ChartsSpec(source=ChartSource.DISABLED)})


def stack_settings(stack: str) -> list[tuple[str, ...]]:
    if stack == "sandbox":  # the game-day CronJob, every minute, so its Job comes while we wait
        return [("--path", "gpufleet:gameday.schedule", EVERY_MINUTE)]
    return []


@pytest.fixture(params=STACKS)
def deployment(
    request: pytest.FixtureRequest, built: tuple[Path, Any], tmp_path: Path
) -> Iterator[Deployment]:
    stack: str = request.param
    kubectl, paths = built
    root = tmp_path / "root"
    stacks = scaled_stacks_dir(stack, tmp_path / "stacks")
    up = gpufleet(
        root,
        "sandbox",
        "up",
        "--kubernetes",
        "--cluster-only",
        "--stack",
        stack,
        "--stacks-dir",
        str(stacks),
        "--timeout",
        "900",
        timeout=1000,
    )
    try:
        assert up.returncode == 0, fail_text(up)
        state = read_kube_state(stack, root)
        assert state.admin_kubeconfig is not None
        kubeconfig = Path(state.admin_kubeconfig)
        context = yaml.safe_load(kubeconfig.read_text())["current-context"]
        project = sandbox_project(
            REPO,
            tmp_path / "pulumi",
            stack,
            paths,
            kubeconfig,
            context,
            stack_settings(stack),
            stacks_dir=stacks,
        )
        api = config.new_client_from_config(config_file=str(kubeconfig))
        pack = policy_pack_copy(REPO, tmp_path)
        policy = ["--policy-pack", str(pack)]
        spec = load_named_stack(stack, stacks)
        if nic_left_out(spec, api):
            # The NicClusterPolicy cannot be created here: the pack is right to flag its absence,
            # and says so as an advisory (asserted below) instead of stopping the deployment.
            cfg = tmp_path / "policy-config.json"
            cfg.write_text(json.dumps({NCCL_POLICY: {"enforcementLevel": "advisory"}}))
            policy += ["--policy-pack-config", str(cfg)]
        with api:
            yield Deployment(stack, spec, state, project, policy, dynamic.DynamicClient(api), kubectl)
    finally:
        down = gpufleet(root, "sandbox", "down", "--kubernetes", "--stack", stack)
        assert down.returncode == 0, fail_text(down)


def cluster_kinds(api: client.ApiClient) -> frozenset[tuple[str, str]]:
    items = client.ApiextensionsV1Api(api).list_custom_resource_definition().items
    return served_kinds([api.sanitize_for_serialization(i) for i in items])


def nic_left_out(spec: StackSpec, api: client.ApiClient) -> bool:
    view = run_offline(charts_disabled(spec), "probe")
    declared = {r.inputs.get("kind") for r in view.custom() if r.type.startswith("kubernetes:mellanox")}
    return "NicClusterPolicy" in declared and ("mellanox.com/v1alpha1", "NicClusterPolicy") not in (
        cluster_kinds(api)
    )


def serves(dyn: dynamic.DynamicClient, api_version: str, kind: str) -> bool:
    try:
        dyn.resources.get(api_version=api_version, kind=kind)
    except ResourceNotFoundError:
        return False
    return True


def expected_left_out(d: Deployment) -> tuple[set[str], set[str]]:
    """(resource names of the releases, of the custom resources) the program must leave out: from
    the mock runtime's view of the same stack, with its charts and with them disabled, and the
    kinds the sandbox's API server serves."""
    with_charts = run_offline(d.spec.model_copy(update={"charts": ChartsSpec()}), d.stack)
    releases = {r.name for r in with_charts.of_type(RELEASE)}
    disabled = run_offline(charts_disabled(d.spec), d.stack)
    crs = {
        r.name
        for r in disabled.custom()
        if "apiVersion" in r.inputs and not serves(d.dyn, str(r.inputs["apiVersion"]), str(r.inputs["kind"]))
    }
    return releases, crs


def live(dyn: dynamic.DynamicClient, api_version: str, kind: str, name: str, ns: str | None) -> Any:
    resource = dyn.resources.get(api_version=api_version, kind=kind)
    try:
        return resource.get(name=name, namespace=ns) if ns else resource.get(name=name)
    except NotFoundError:
        return None


def state_objects(project: PulumiProject) -> list[dict[str, Any]]:
    """Kubernetes objects in the stack's state (not providers, not patches): type, urn, outputs."""
    export = json.loads(project.run("stack", "export").stdout)
    out = []
    for r in export["deployment"]["resources"]:
        t = r["type"]
        if not t.startswith("kubernetes:") or t.startswith("pulumi:providers") or t.endswith(PATCH_SUFFIX):
            continue
        out.append(r)
    return out


def ident(r: dict[str, Any]) -> tuple[str, str, str, str | None]:
    o = r["outputs"]
    return o["apiVersion"], o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")


def managed_by_pulumi(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        m
        for m in obj["metadata"].get("managedFields") or []
        if m["manager"].startswith(PULUMI_MANAGER) and m["operation"] == "Apply"
    ]


def outputs(project: PulumiProject) -> dict[str, Any]:
    return dict(json.loads(project.run("stack", "output", "--json").stdout))


def check_nodes_after_up(d: Deployment) -> None:
    """Every node the program patched is a node the sandbox made (a patch onto a missing Node would
    have created an empty one: server-side apply upserts), and each carries the program's fields."""
    nodes = {
        n.metadata.name: n.to_dict() for n in d.dyn.resources.get(api_version="v1", kind="Node").get().items
    }
    gpu = {n.name: n for n in plan_nodes(d.spec)}
    storage = {n.name for n in plan_storage_nodes(d.spec)}
    assert set(nodes) == set(gpu) | storage
    for name, node in nodes.items():
        mine = managed_by_pulumi(node)
        assert len(mine) == 1, (name, [m["manager"] for m in node["metadata"]["managedFields"]])
        fields = json.dumps(mine[0]["fieldsV1"])
        if name in gpu:
            assert "gpufleet.io/pool" in fields and "f:taints" in fields, name
            for t in gpu[name].taints:
                assert {k: v for k, v in t.items() if v} in [
                    {k: v for k, v in x.items() if k in ("key", "value", "effect") and v}
                    for x in node["spec"]["taints"]
                ], (name, t)
    ceph = d.spec.storage.ceph
    if ceph is not None:
        for s in ceph.storage_nodes:
            labels = nodes[s.name]["metadata"]["labels"]
            assert labels["topology.rook.io/rack"] == s.rack
            assert labels.items() >= ceph.osd_node_selector.items()


def check_read_back(d: Deployment) -> list[dict[str, Any]]:
    """Every object in the state exists in the API server; named ones have the program's content."""
    objects = state_objects(d.project)
    missing = [ident(r) for r in objects if live(d.dyn, *ident(r)) is None]
    assert objects and missing == []
    for vendor in vendors(d.spec):
        cm = live(d.dyn, "v1", "ConfigMap", f"collective-env-{vendor.value}", "gpufleet-system")
        assert cm is not None and cm.to_dict()["data"] == collective_environment(d.spec.fabric, vendor)
    role = live(d.dyn, "rbac.authorization.k8s.io/v1", "ClusterRole", GAMEDAY_SA, None)
    assert [{k: v for k, v in r.items() if v} for r in role.to_dict()["rules"]] == gameday_rbac_rules()
    cron = live(d.dyn, "batch/v1", "CronJob", GAMEDAY_SA, d.spec.gameday.namespace)
    want = EVERY_MINUTE if d.stack == "sandbox" else d.spec.gameday.schedule
    assert cron is not None and cron.spec.schedule == want
    return objects


def check_left_out(d: Deployment, out: dict[str, Any], up_text: str) -> None:
    releases, crs = expected_left_out(d)
    left = {x["resource"]: x for x in out["leftOut"]}
    assert set(left) == releases | crs
    for name in releases:
        assert left[name]["what"].startswith("helm release ")
        assert f"left out: {left[name]['what']} ({name})" in up_text  # said in the output
    for name in crs:
        assert "its CRD is not installed" in left[name]["reason"]
        assert f"left out: {left[name]['what']} ({name})" in up_text


def check_gameday_cronjob(d: Deployment) -> None:
    """The CronJob controller of the real controller manager creates the game-day Job on the
    schedule; the Job controller its pod. The pod never runs: kwok nodes run no container and no
    image registry is reachable (and every sandbox node carries the GPU taint the game-day pod
    does not tolerate), so the Job object and its pod are what is checked."""
    ns = d.spec.gameday.namespace
    jobs = d.dyn.resources.get(api_version="batch/v1", kind="Job")

    def created() -> Any:
        items = jobs.get(namespace=ns).items
        owned = [
            j
            for j in items
            if any(o.kind == "CronJob" and o.name == GAMEDAY_SA for o in j.metadata.ownerReferences or [])
        ]
        return owned[0] if owned else None

    job = wait_until("the CronJob controller's Job", created, 130, 2)
    container = job.spec.template.spec.containers[0]
    assert container.command[:3] == ["gpufleet", "gameday", "--stack"]
    assert job.spec.template.spec.serviceAccountName == GAMEDAY_SA
    pods = d.dyn.resources.get(api_version="v1", kind="Pod")
    selector = f"job-name={job.metadata.name}"
    pod = wait_until(
        "the Job's pod",
        lambda: next(iter(pods.get(namespace=ns, label_selector=selector).items), None),
        60,
        1,
    )
    assert pod.status.phase == "Pending"  # never started: see the docstring


def can_i(
    d: Deployment, verb: str, resource: str, namespace: str | None = None, name: str | None = None
) -> bool:
    """`kubectl auth can-i` as the game-day ServiceAccount (a SubjectAccessReview of the real RBAC);
    `pods/eviction` is the resource `pods` with the subresource `eviction`; `name`: one object."""
    assert d.state.admin_kubeconfig is not None
    resource, _, sub = resource.partition("/")
    who = f"system:serviceaccount:{d.spec.gameday.namespace}:{GAMEDAY_SA}"
    what = f"{resource}/{name}" if name else resource
    argv = [str(d.kubectl), "--kubeconfig", d.state.admin_kubeconfig, "auth", "can-i", verb, what]
    argv += ["--as", who] + (["--subresource", sub] if sub else [])
    argv += ["-n", namespace] if namespace else ["--all-namespaces"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    answer = proc.stdout.strip()
    assert answer in ("yes", "no"), fail_text(proc)
    return answer == "yes"


def check_gameday_rbac(d: Deployment) -> None:
    """What the Kubernetes chaos backend does on real nodes, granted; Secrets and more, refused."""
    ns = d.spec.gameday.namespace
    for rules, scope in ((gameday_rbac_rules(), None), (gameday_namespace_rules(), ns)):
        for rule in rules:
            for group in rule["apiGroups"]:
                for res in rule["resources"]:
                    base, _, sub = res.partition("/")
                    name = (f"{base}.{group}" if group else base) + (f"/{sub}" if sub else "")
                    for verb in rule["verbs"]:
                        for one in rule.get("resourceNames") or [None]:
                            assert can_i(d, verb, name, scope, one), (verb, name, scope, one)
    for verb in ("get", "list", "watch"):
        assert not can_i(d, verb, "secrets"), verb
        assert not can_i(d, verb, "secrets", ns), verb
    assert not can_i(d, "delete", "nodes")
    assert not can_i(d, "create", "pods", "default")  # fault pods only in the game-day namespace
    # The fault ledger's ConfigMap by its name only: not the stack's copy beside it.
    assert not can_i(d, "patch", "configmaps", ns, "gpufleet-stack")
    assert not can_i(d, "get", "configmaps", ns)
    assert not can_i(d, "update", "clusterroles.rbac.authorization.k8s.io")


def check_flavor_replaced(d: Deployment) -> None:
    """A ResourceFlavor with a topologyName is immutable (Kueue's CRD); a changed pool taint must
    replace it (delete first) on the next `up`, not fail on the API server's refusal."""
    pool = d.spec.node_pools[0]
    before = live(d.dyn, "kueue.x-k8s.io/v1beta1", "ResourceFlavor", pool.name, None)
    assert before is not None and before.spec.topologyName == "gpufleet"
    # What an in-place update gets from the real API server (so the program must replace it):
    flavors = d.dyn.resources.get(api_version="kueue.x-k8s.io/v1beta1", kind="ResourceFlavor")
    tolerations = [*before.to_dict()["spec"]["tolerations"], {"key": "x", "operator": "Exists"}]
    with pytest.raises(UnprocessibleEntityError) as refused:
        flavors.patch(
            name=pool.name,
            body={"spec": {"tolerations": tolerations}},
            content_type="application/merge-patch+json",
        )
    assert "immutable when topologyName is set" in str(refused.value.body)
    taint = len(pool.taints)
    d.project.config_set("--path", f"gpufleet:nodePools[0].taints[{taint}].key", "gpufleet.io/e2e")
    d.project.config_set("--path", f"gpufleet:nodePools[0].taints[{taint}].effect", "NoSchedule")
    # The new taint also changes every node's taint list, which the sandbox set when it made the
    # nodes (as a kubelet registering with taints does): server-side apply calls that a conflict,
    # so this `up` fails, and one with patch force takes the field over (docs/pulumi.md "Known
    # limits").
    conflict = d.project.run("up", "--yes", "--skip-preview", *d.policy, check=False)
    text = conflict.stdout + conflict.stderr
    assert conflict.returncode != 0 and "conflict" in text.lower() and "spec.taints" in text, text[-3000:]
    d.project.env["PULUMI_K8S_ENABLE_PATCH_FORCE"] = "true"
    try:
        up = d.project.run("up", "--yes", "--skip-preview", *d.policy)
    finally:
        del d.project.env["PULUMI_K8S_ENABLE_PATCH_FORCE"]
    assert "replaced" in up.stdout, up.stdout[-3000:]
    after = live(d.dyn, "kueue.x-k8s.io/v1beta1", "ResourceFlavor", pool.name, None)
    assert after.metadata.uid != before.metadata.uid
    assert {"key": "gpufleet.io/e2e", "effect": "NoSchedule", "operator": "Exists"} in [
        {k: v for k, v in t.items() if v} for t in after.to_dict()["spec"]["tolerations"]
    ]
    d.project.run("up", "--yes", "--skip-preview", "--expect-no-changes", *d.policy)


def check_after_destroy(d: Deployment, objects: list[dict[str, Any]]) -> None:
    """Retained objects stay (storage, operator namespaces), every other one is gone, and the
    node patches' fields are given back (the storage nodes lose the labels the program set)."""
    for r in objects:
        retained = r.get("retainOnDelete", False)
        obj = live(d.dyn, *ident(r))
        if retained:
            assert obj is not None, ident(r)
        elif obj is not None:
            assert obj.metadata.deletionTimestamp is not None, ident(r)  # on its way out
    nodes = d.dyn.resources.get(api_version="v1", kind="Node").get().items
    for n in nodes:
        assert managed_by_pulumi(n.to_dict()) == [], n.metadata.name
    storage = {n.name for n in plan_storage_nodes(d.spec)}
    for n in nodes:
        if n.metadata.name in storage:
            assert "topology.rook.io/rack" not in n.to_dict()["metadata"].get("labels", {})


def test_stack_deploys_to_the_sandbox(deployment: Deployment) -> None:
    d = deployment
    took: dict[str, float] = {}

    def step(name: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        t = time.monotonic()
        proc = d.project.run(*args, check=check)
        took[name] = round(time.monotonic() - t, 1)
        return proc

    preview = step("preview", "preview", *d.policy)
    assert "to create" in preview.stdout and "Policies:" in preview.stdout, preview.stdout[-3000:]
    if "--policy-pack-config" in d.policy:  # advisory here: the NicClusterPolicy is left out
        assert NCCL_POLICY in preview.stdout and "without a NicClusterPolicy" in preview.stdout

    up = step("up", "up", "--yes", "--skip-preview", *d.policy)
    out = outputs(d.project)
    check_left_out(d, out, up.stdout + up.stderr)
    objects = check_read_back(d)
    check_nodes_after_up(d)
    if d.stack == "sandbox":
        check_gameday_cronjob(d)
        check_gameday_rbac(d)

    step("up again", "up", "--yes", "--skip-preview", "--expect-no-changes", *d.policy)
    step("refresh", "refresh", "--yes", "--skip-preview", "--expect-no-changes")
    if d.spec.scheduler.kind.value == "kueue":
        check_flavor_replaced(d)

    protected = d.spec.cluster.environment.value != "sandbox"
    destroy = step(
        "destroy refused" if protected else "destroy",
        "destroy",
        "--yes",
        "--skip-preview",
        check=not protected,
    )
    if protected:  # storage objects are protected outside the sandbox (docs/pulumi.md)
        assert destroy.returncode != 0 and "protected" in destroy.stdout + destroy.stderr
        d.project.run("state", "unprotect", "--all", "--yes")
        step("destroy", "destroy", "--yes", "--skip-preview")
    check_after_destroy(d, objects)
    print(f"{d.stack}: {len(objects)} objects, load {os.getloadavg()[0]:.1f}, seconds {took}")
