"""Issue 13: what the program declares must do what the pinned charts and operators do. Each test
cites the upstream file read at the pinned version (gpufleet/infra/charts.py)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from infra_testdata import ROOT, STACK_NAMES, load_policies, shipped, variant

from gpufleet.catalog import isolating_xids, load_catalog, xid_policy
from gpufleet.config import SchedulerKind, Vendor, all_specs
from gpufleet.config.model import StackSpec, decrypted_by_pulumi
from gpufleet.core.errors import InputError
from gpufleet.infra.charts import POD_SECURITY
from gpufleet.infra.gameday import rules_allow
from gpufleet.infra.npd_check import MAX_OUTPUT, render_script
from gpufleet.infra.offline import DeclaredResource, OfflinePreview
from gpufleet.infra.platform import vendors
from gpufleet.infra.scheduler import KUEUE_FRAMEWORKS, kueue_excluded

RELEASE = "kubernetes:helm.sh/v3:Release"
CQ = "kubernetes:kueue.x-k8s.io/v1beta1:ClusterQueue"
LQ = "kubernetes:kueue.x-k8s.io/v1beta1:LocalQueue"


def release(view: OfflinePreview, name: str) -> DeclaredResource:
    (r,) = [r for r in view.of_type(RELEASE) if r.inputs["name"] == name]
    return r


def releases(view: OfflinePreview) -> list[str]:
    return sorted(r.inputs["name"] for r in view.of_type(RELEASE))


def pod_specs(view: OfflinePreview) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(resource name, pod metadata, pod spec) of every pod template the program declares."""
    out = []
    for r in view.custom():
        spec = r.inputs.get("spec") or {}
        if r.type == "kubernetes:core/v1:PodTemplate":
            tpl = r.inputs["template"]
        elif r.type == "kubernetes:batch/v1:CronJob":
            tpl = spec["jobTemplate"]["spec"]["template"]
        elif r.type.startswith("kubernetes:apps/v1:") or r.type == "kubernetes:batch/v1:Job":
            tpl = spec["template"]
        else:
            continue
        out.append((r.name, tpl.get("metadata") or {}, tpl["spec"]))
    return out


# --------------------------------------------------------------------------- Kueue v0.12.3


@pytest.mark.parametrize("name", STACK_NAMES)
def test_every_pod_template_requests_only_resources_a_queue_covers(name: str) -> None:
    """kueue v0.12.3 pkg/scheduler/flavorassigner/flavorassigner.go: a request for a resource no
    resource group covers is refused ("resource %s unavailable in ClusterQueue"); excluded
    prefixes are dropped first (pkg/workload/workload.go dropExcludedResources)."""
    spec, view = shipped(name)
    if spec.scheduler.kind is not SchedulerKind.KUEUE:
        pytest.skip("no Kueue on this stack (Volcano / Slurm do not refuse uncovered resources)")
    covered = {
        c.inputs["metadata"]["name"]: {
            res for g in c.inputs["spec"]["resourceGroups"] for res in g["coveredResources"]
        }
        for c in view.of_type(CQ)
    }
    local = {q.inputs["metadata"]["name"]: q.inputs["spec"]["clusterQueue"] for q in view.of_type(LQ)}
    kueue_pods = [
        (n, m, s) for n, m, s in pod_specs(view) if "kueue.x-k8s.io/queue-name" in m.get("labels", {})
    ]
    assert kueue_pods, "the training pod templates carry a queue label"
    for res_name, meta, pod in kueue_pods:
        queue = local[meta["labels"]["kueue.x-k8s.io/queue-name"]]
        for c in pod["containers"]:
            for r in (c.get("resources") or {}).get("requests", {}):
                assert kueue_excluded(r) or r in covered[queue], (res_name, r, queue)


def test_kueue_config_is_whole_with_integrations_and_tas_gate() -> None:
    """kueue v0.12.3 charts/kueue/values.yaml: managerConfig.controllerManagerConfigYaml is the whole
    Configuration (health, metrics, webhook, leaderElection, integrations.frameworks);
    pkg/features/kube_features.go: TopologyAwareScheduling alpha, default off, set through
    controllerManager.featureGates (templates/_helpers.tpl kueue.featureGates)."""
    _, view = shipped("b200-roce")
    values = release(view, "kueue").inputs["values"]
    config = yaml.safe_load(values["managerConfig"]["controllerManagerConfigYaml"])
    assert config["kind"] == "Configuration" and config["apiVersion"] == "config.kueue.x-k8s.io/v1beta1"
    assert config["health"]["healthProbeBindAddress"] == ":8081" and config["webhook"]["port"] == 9443
    assert config["leaderElection"]["leaderElect"] is True
    frameworks = config["integrations"]["frameworks"]
    assert {"kubeflow.org/pytorchjob", "jobset.x-k8s.io/jobset", "kubeflow.org/mpijob", "batch/job"} <= set(
        frameworks
    )
    assert tuple(frameworks) == KUEUE_FRAMEWORKS
    assert config["waitForPodsReady"]["enable"] is True
    assert "cpu" in config["resources"]["excludeResourcePrefixes"]
    assert values["controllerManager"]["featureGates"] == [
        {"name": "TopologyAwareScheduling", "enabled": True}
    ]
    assert view.of_type("kubernetes:kueue.x-k8s.io/v1alpha1:Topology")


# --------------------------------------------------------------------------- Slinky slurm 0.3.0


def test_slurm_renders_nodesets_and_partitions_and_decides_its_extras() -> None:
    """slurm-operator v0.3.0 helm/slurm/templates/compute/compute-nodeset.yaml renders a NodeSet only
    `if $nodeset.enabled`; templates/controller/slurm-configmap.yaml a partition only
    `if and $part.enabled $part.nodesets`, ranging over `$part.config` as a map; values.yaml turns
    accounting, mariadb and slurm-exporter on by default."""
    spec, view = shipped("sandbox")
    values = release(view, "slurm").inputs["values"]
    sets = values["compute"]["nodesets"]
    assert sets and all(n["enabled"] is True for n in sets)
    parts = values["compute"]["partitions"]
    assert [p["name"] for p in parts] == [q.name for q in spec.scheduler.queues]
    assert all(p["enabled"] and p["nodesets"] and isinstance(p["config"], dict) for p in parts)
    names = {n["name"] for n in sets}
    assert all(set(p["nodesets"]) <= names for p in parts)
    assert values["accounting"] == {"enabled": False} and values["mariadb"] == {"enabled": False}
    assert values["slurm-exporter"] == {"enabled": True}
    assert view.outputs["queues"] == [q.name for q in spec.scheduler.queues]


# --------------------------------------------------------------------------- Volcano v1.12.1


def test_volcano_scheduler_runs_the_network_topology_plugin() -> None:
    """volcano v1.12.1 installer/helm/chart/volcano/config/volcano-scheduler.conf lacks
    `network-topology-aware` (pkg/scheduler/plugins/network-topology-aware, PluginName);
    values.yaml `custom.scheduler_config_override` replaces the configuration. Its label
    discoverer is a stub (pkg/controllers/hypernode/discovery/label/label.go), so topology comes
    only from the HyperNodes the program declares, not from volcano.sh/* node labels."""
    _, view = shipped("h200-ib")
    conf = yaml.safe_load(release(view, "volcano").inputs["values"]["custom"]["scheduler_config_override"])
    plugins = [p["name"] for tier in conf["tiers"] for p in tier["plugins"]]
    assert "network-topology-aware" in plugins and {"gang", "proportion", "predicates"} <= set(plugins)
    assert view.of_type("kubernetes:topology.volcano.sh/v1alpha1:HyperNode")
    labels = json.dumps(
        [r.inputs["metadata"]["labels"] for r in view.of_type("kubernetes:core/v1:NodePatch")]
    )
    assert "volcano.sh/" not in labels


# --------------------------------------------------------------------------- Rook


def test_rook_rack_pool_has_labelled_storage_nodes() -> None:
    """Rook CephCluster docs ("OSD Topology"): the CRUSH rack comes from `topology.rook.io/rack`
    node labels; the OSD placement selector must match labelled nodes."""
    spec, view = shipped("h200-ib")
    assert spec.storage.ceph is not None
    (cluster,) = view.of_type("kubernetes:ceph.rook.io/v1:CephCluster")
    terms = cluster.inputs["spec"]["placement"]["osd"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"][0]["matchExpressions"]
    patched = {
        r.inputs["metadata"]["name"]: r.inputs["metadata"]["labels"]
        for r in view.of_type("kubernetes:core/v1:NodePatch")
    }
    storage = [patched[n.name] for n in spec.storage.ceph.storage_nodes]
    assert storage and all(all(labels[e["key"]] in e["values"] for e in terms) for labels in storage)
    assert len({labels["topology.rook.io/rack"] for labels in storage}) >= 3


def _ceph(pools: list[dict[str, Any]], nodes: list[dict[str, str]]) -> Any:
    def change(d: dict[str, Any]) -> None:
        d["storage"]["ceph"]["pools"] = pools
        d["storage"]["ceph"]["storageNodes"] = nodes

    return lambda: variant("h200-ib", change)


def test_validate_refuses_a_rack_pool_that_cannot_be_placed() -> None:
    two_racks = [{"name": f"c{i}", "rack": f"r{i % 2}"} for i in range(4)]
    with pytest.raises(ValueError, match="3 replicas across racks, but storageNodes span 2"):
        _ceph([{"name": "p", "replicas": 3, "failureDomain": "rack"}], two_racks)()
    with pytest.raises(ValueError, match="failureDomain rack needs storageNodes"):
        _ceph([{"name": "p", "replicas": 3, "failureDomain": "rack"}], [])()
    three = [{"name": f"c{i}", "rack": f"r{i}"} for i in range(3)]
    assert _ceph([{"name": "p", "replicas": 3, "failureDomain": "rack"}], three)().storage.ceph is not None


# --------------------------------------------------------------------------- operators per vendor


@pytest.mark.parametrize("name", STACK_NAMES)
def test_operators_once_each_and_only_for_their_vendor(name: str) -> None:
    """NVSentinel and the Network Operator are NVIDIA's (ConnectX); NVIDIA's GPU Operator docs allow
    one NFD per cluster, so the GPU/Network/AMD operators' bundled NFD is off (`nfd.enabled`,
    ROCm gpu-operator v1.2.0 helm-charts/values.yaml `node-feature-discovery.enabled`);
    slurm-operator v0.3.0 helm/slurm-operator/values.yaml `certManager.enabled: true` needs cert-manager."""
    spec, view = shipped(name)
    vs = vendors(spec)
    names = releases(view)
    assert len(names) == len(set(names))
    assert ("nvsentinel" in names) == (Vendor.NVIDIA in vs)
    if vs == {Vendor.HUAWEI}:
        assert "network-operator" not in names
    assert names.count("node-feature-discovery") == (1 if vs - {Vendor.HUAWEI} else 0)
    for bundled in ("gpu-operator", "network-operator"):
        if bundled in names:
            assert release(view, bundled).inputs["values"]["nfd"] == {"enabled": False}
    if "amd-gpu-operator" in names:
        assert release(view, "amd-gpu-operator").inputs["values"]["node-feature-discovery"] == {
            "enabled": False
        }
    needs_certs = "nvsentinel" in names or "slurm-operator" in names
    assert ("cert-manager" in names) == needs_certs


def test_ascend_device_plugin_has_its_service_account_and_role() -> None:
    """MindCluster device-plugin manifests ship ServiceAccount ascend-device-plugin-sa and ClusterRole
    pods-node-ascend-device-plugin-role (pods get/list/update/watch/patch, nodes get/patch,
    nodes/status, configmaps, events)."""
    _, view = shipped("ascend-910b-roce")
    (ds,) = view.of_type("kubernetes:apps/v1:DaemonSet")
    sa = ds.inputs["spec"]["template"]["spec"]["serviceAccountName"]
    assert sa in {s.inputs["metadata"]["name"] for s in view.of_type("kubernetes:core/v1:ServiceAccount")}
    (role,) = [
        r
        for r in view.of_type("kubernetes:rbac.authorization.k8s.io/v1:ClusterRole")
        if r.inputs["metadata"]["name"] == "pods-node-ascend-device-plugin-role"
    ]
    rules = role.inputs["rules"]
    assert rules_allow(rules, "patch", "pods") and rules_allow(rules, "patch", "nodes/status")
    assert rules_allow(rules, "create", "configmaps") and not rules_allow(rules, "get", "secrets")


def test_amd_operands_tolerate_the_pool_taint() -> None:
    """ROCm gpu-operator v1.2.0 helm-charts/crds/deviceconfig-crd.yaml: devicePluginTolerations,
    nodeLabellerTolerations, metricsExporter.tolerations."""
    _, view = shipped("mi300x-roce")
    (dc,) = view.of_type("kubernetes:amd.com/v1alpha1:DeviceConfig")
    spec = dc.inputs["spec"]
    taint = {"key": "amd.com/gpu", "effect": "NoSchedule", "operator": "Exists"}
    for tol in (
        spec["devicePlugin"]["devicePluginTolerations"],
        spec["devicePlugin"]["nodeLabellerTolerations"],
        spec["metricsExporter"]["tolerations"],
    ):
        assert taint in tol


@pytest.mark.parametrize("name", STACK_NAMES)
def test_privileged_operator_namespaces_carry_pod_security_labels(name: str) -> None:
    """Kubernetes Pod Security admission: a namespace's `pod-security.kubernetes.io/enforce` level."""
    _, view = shipped(name)
    namespaces = {
        r.inputs["metadata"]["name"]: r.inputs["metadata"]["labels"]
        for r in view.of_type("kubernetes:core/v1:Namespace")
    }
    for r in view.of_type(RELEASE):
        ns = r.inputs["namespace"]
        assert r.inputs["createNamespace"] is False
        if ns == "kube-system":
            continue
        assert namespaces[ns]["pod-security.kubernetes.io/enforce"] == POD_SECURITY[r.inputs["name"]]


# --------------------------------------------------------------------------- node-problem-detector


def _run_check(tmp_path: Path, dmesg: str | None, ports: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run the generated script as NPD does (`/bin/sh <file>`, dash on Debian like the NPD image),
    with a fake `dmesg` first on PATH and a fake /sys."""
    table, _ = xid_policy(load_catalog(), {})
    script = tmp_path / "gpufleet-node-health.sh"
    script.write_text(render_script(table))
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    fake = bindir / "dmesg"
    fake.write_text("#!/bin/sh\nexit 1\n" if dmesg is None else f"#!/bin/sh\ncat <<'EOF'\n{dmesg}\nEOF\n")
    fake.chmod(0o755)
    sysfs = tmp_path / "sys"
    for port, state in ports.items():
        hca, num = port.split("/")
        d = sysfs / "class" / "infiniband" / hca / "ports" / num
        d.mkdir(parents=True, exist_ok=True)
        (d / "state").write_text(state + "\n")
    env = {**os.environ, "PATH": f"{bindir}:/usr/bin:/bin", "GPUFLEET_SYSFS": str(sysfs)}
    return subprocess.run(
        ["/bin/sh", str(script)], capture_output=True, text=True, env=env, timeout=30, check=False
    )


def test_npd_check_runs_under_sh_with_npd_exit_codes(tmp_path: Path) -> None:
    """node-problem-detector docs, custom plugin monitor: exit 0 OK, 1 NonOK, other Unknown; stdout
    the message (max_output_length). NPD image (kubernetes/node-problem-detector Dockerfile):
    debian-base bookworm + util-linux + bash, no Python."""
    table, _ = xid_policy(load_catalog(), {})
    fatal = isolating_xids(table)
    assert 79 in fatal
    ok = _run_check(tmp_path, "[  1.0] boot ok", {"mlx5_0/1": "4: ACTIVE"})
    assert ok.returncode == 0 and ok.stdout.startswith("OK")
    xid = _run_check(
        tmp_path, "[ 9.1] NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.", {}
    )
    assert xid.returncode == 1 and "XID 79" in xid.stdout and "0000:18:00" in xid.stdout
    mild = [x for x in table if x not in fatal]
    if mild:
        quiet = _run_check(tmp_path, f"NVRM: Xid (PCI:0000:18:00): {mild[0]}, pid=1", {})
        assert quiet.returncode == 0, quiet.stdout
    down = _run_check(tmp_path, "ok", {"mlx5_0/1": "4: ACTIVE", "mlx5_3/1": "1: DOWN"})
    assert down.returncode == 1 and "mlx5_3/1" in down.stdout
    unknown = _run_check(tmp_path, None, {})
    assert unknown.returncode == 2 and unknown.stdout.startswith("UNKNOWN")
    long = _run_check(tmp_path, "ok", {f"mlx5_{i}/1": "1: DOWN" for i in range(40)})
    for r in (ok, xid, down, unknown, long):
        assert len(r.stdout.rstrip("\n")) <= MAX_OUTPUT and r.stdout.count("\n") == 1


def test_npd_check_follows_stack_xid_overrides(tmp_path: Path) -> None:
    spec = variant(
        "h200-ib",
        lambda d: d["remediation"].update(
            xidOverrides={"13": {"action": "reboot-node", "faultClass": "gpu-fatal", "reason": "test"}}
        ),
    )
    from gpufleet.infra.platform import xid_table

    assert 13 in isolating_xids(xid_table(spec))
    script = render_script(xid_table(spec))
    fatal = script.split('fatal="')[1].split('"')[0].split()
    assert "13" in fatal


def test_npd_runs_the_shipped_script_not_a_host_binary() -> None:
    _, view = shipped("h200-ib")
    settings = release(view, "node-problem-detector").inputs["values"]["settings"]
    plugin = json.loads(settings["custom_monitor_definitions"]["gpufleet-health.json"])
    (rule,) = plugin["rules"]
    assert rule["path"] == "/bin/sh" and rule["args"] == ["/custom-config/gpufleet-node-health.sh"]
    assert settings["custom_monitor_definitions"]["gpufleet-node-health.sh"].startswith("#!/bin/sh")
    assert plugin["pluginConfig"]["max_output_length"] == MAX_OUTPUT
    assert "hostPath" not in json.dumps(release(view, "node-problem-detector").inputs["values"])


# --------------------------------------------------------------------------- NVSentinel policy


def test_remediation_policy_reaches_nvsentinel_in_full() -> None:
    """NVSentinel docs/configuration/fault-quarantine.md "Rule Sets" (CEL over HealthEvent
    errorCode); the resolved policy is published beside it. Each field's NVSentinel setting:
    test_remediation_nvsentinel.py (attempt caps have none and are refused by validate)."""
    spec = variant(
        "h200-ib",
        lambda d: d["remediation"].update(
            xidOverrides={"13": {"action": "reboot-node", "faultClass": "gpu-fatal", "reason": "flaky SM"}},
        ),
    )
    from gpufleet.infra.offline import run_offline

    view = run_offline(spec, "policy")
    values = release(view, "nvsentinel").inputs["values"]
    rules = values["fault-quarantine"]["ruleSets"]
    xid_rule = next(r for r in rules if r["name"] == "gpufleet-isolating-xids")
    assert "'13'" in xid_rule["match"]["all"][0]["expression"]
    (cm,) = [
        r
        for r in view.of_type("kubernetes:core/v1:ConfigMap")
        if r.inputs["metadata"]["name"] == "gpufleet-remediation-policy"
    ]
    policy = json.loads(cm.inputs["data"]["policy.json"])
    assert policy["xids"]["13"]["action"] == "reboot-node" and policy["xids"]["13"]["source"].startswith(
        "stack"
    )


# --------------------------------------------------------------------------- Grafana and secrets


@pytest.mark.parametrize("name", STACK_NAMES)
def test_grafana_admin_comes_from_a_secret(name: str) -> None:
    """kube-prometheus-stack values.yaml `grafana.adminPassword: prom-operator` is the default; the
    grafana subchart reads `admin.existingSecret/userKey/passwordKey` instead. A stack without a
    password (the sandbox stacks) gets no Grafana at all, never one with the default."""
    spec, view = shipped(name)
    grafana = release(view, "kube-prometheus-stack").inputs["values"]["grafana"]
    assert "adminPassword" not in grafana
    secrets = [
        s
        for s in view.of_type("kubernetes:core/v1:Secret")
        if s.inputs["metadata"]["name"] == "grafana-admin"
    ]
    if spec.monitoring.grafana_admin_password is None:
        assert grafana["enabled"] is False and secrets == []
        return
    assert grafana["enabled"] is True and grafana["admin"]["existingSecret"] == "grafana-admin"
    (secret,) = secrets
    assert secret.inputs["stringData"] == "[secret]"


def test_validate_refuses_plaintext_secrets_default_grafana_and_url_credentials() -> None:
    def plain(d: dict[str, Any]) -> None:
        d["storage"]["juicefs"]["metaUrl"] = "redis://:pw@meta:6379/1"

    with pytest.raises(ValueError, match="plain-text secret in a production stack"):
        variant("h200-ib", plain)
    # Under `pulumi up` the same value arrives decrypted from a `secure:` key: accepted.
    with decrypted_by_pulumi(frozenset({"storage"})):
        assert variant("h200-ib", plain).storage.juicefs is not None
    with pytest.raises(ValueError, match="Grafana needs an admin password"):
        variant("h200-ib", lambda d: d["monitoring"].pop("grafanaAdminPassword"))
    with pytest.raises(ValueError, match="default password"):
        variant("h200-ib", lambda d: d["monitoring"].update(grafanaAdminPassword="prom-operator"))
    with pytest.raises(ValueError, match="URL carries a password"):
        variant("h200-ib", lambda d: d["storage"]["juicefs"].update(bucket="https://AK:SK@s3.host/b"))
    sandbox = shipped("sandbox")[0]
    assert isinstance(sandbox, StackSpec)  # plain secrets stay allowed in the sandbox


def test_validate_cli_path_reports_plaintext(tmp_path: Path) -> None:
    text = (ROOT / "stacks" / "Pulumi.scale-10k.yaml").read_text()
    doc = yaml.safe_load(text)
    doc["config"]["gpufleet:storage"]["juicefs"]["accessKey"] = "AKIAABCDEFGHIJKLMNOP"
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    from gpufleet.config import load_stack

    with pytest.raises(InputError) as err:
        load_stack(bad)
    assert "storage.juicefs.accessKey: a plain-text secret" in err.value.render()


# --------------------------------------------------------------------------- policy pack


def test_policy_pack_imports_nothing_of_gpufleet() -> None:
    for f in ("gpufleet_policies.py", "__main__.py"):
        tree = ast.parse((ROOT / "policypack" / f).read_text())
        mods = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        mods += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [m for m in mods if m.startswith("gpufleet.") or m == "gpufleet"], f
    reqs = (ROOT / "policypack" / "requirements.txt").read_text()
    deps = [line for line in reqs.splitlines() if line.strip() and not line.startswith("#")]
    assert any(d.startswith("pulumi-policy") for d in deps) and not any("gpufleet" in d for d in deps)
    code = (
        "import sys; sys.path.insert(0, 'policypack'); import gpufleet_policies; "
        "print('gpufleet' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_policy_pack_tables_agree_with_gpufleet() -> None:
    P = load_policies()
    table = {v: (fixed, present, res) for v, fixed, present, res in P.GPU_VENDORS}
    for spec in all_specs():
        fixed, present, res = table[spec.vendor.value]
        assert res == spec.resource_name
        assert all(spec.node_labels.get(k) == v for k, v in fixed.items()), spec
        assert all(k in spec.node_labels or k == "nvidia.com/gpu.count" for k in present), spec
    rules = [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]},
        {"apiGroups": ["*"], "resources": ["*"], "verbs": ["get"]},
    ]
    for verb, res in (("patch", "nodes"), ("get", "secrets"), ("delete", "pods")):
        assert P.rules_allow(rules, verb, res) == rules_allow(rules, verb, res)


# --------------------------------------------------------------------------- Pulumi hygiene


@pytest.mark.parametrize("name", STACK_NAMES)
def test_every_kubernetes_object_uses_the_stacks_provider(name: str) -> None:
    _, view = shipped(name)
    (provider,) = view.of_type("pulumi:providers:kubernetes")
    assert provider.inputs["context"] == f"{name}-context"
    for r in view.custom():
        if r.type.startswith("kubernetes:"):
            assert r.provider.startswith(provider.urn), r.urn


@pytest.mark.parametrize("name", ["h200-ib", "b200-roce", "mi300x-roce"])
def test_storage_and_operators_survive_destroy(name: str) -> None:
    _, view = shipped(name)
    for r in view.of_type("kubernetes:ceph.rook.io/v1:CephCluster") + view.of_type(
        "kubernetes:ceph.rook.io/v1:CephBlockPool"
    ):
        assert r.protect and r.retain_on_delete, r.urn
    for op in ("rook-ceph", "gpu-operator", "amd-gpu-operator", "network-operator"):
        if op in releases(view):
            assert release(view, op).retain_on_delete, op


@pytest.mark.parametrize("name", STACK_NAMES)
def test_outputs_are_derived_from_resources(name: str) -> None:
    spec, view = shipped(name)
    out = view.outputs
    assert out["queues"] == [q.name for q in spec.scheduler.queues]
    assert out["storageClasses"] == ([f"juicefs-{spec.storage.juicefs.name}"] if spec.storage.juicefs else [])
    assert out["endpoints"]["prometheus"].startswith("http://kube-prometheus-stack-prometheus.monitoring.svc")
    assert len(out["trainingPodTemplates"]) == len(spec.node_pools)
