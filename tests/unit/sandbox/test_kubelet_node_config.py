"""The kubelet nodes' configuration (gpufleet.sandbox.kube.kubelet_node, ADR 0081): what containerd,
the kubelet and CNI are told, decided without starting anything."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import tomllib
from pathlib import Path

import pytest

from gpufleet.config import load_named_stack
from gpufleet.sandbox.kube import kubelet_node, oci_archive
from gpufleet.sandbox.kube.nodes import plan_nodes
from gpufleet.sandbox.kube.pki import node_cert_specs

RUN_ID = "a1b2c3"


def layout(tmp_path: Path) -> kubelet_node.KubeletNodeLayout:
    ports = {"kubelet-gpu-3": 40001, "kubelet-gpu-3-healthz": 40002, "kubelet-gpu-3-stream": 40003}
    return kubelet_node.layout(RUN_ID, tmp_path / "run-a1b2c3", "gpu-3", 0, ports)


def test_the_first_pools_last_compute_nodes_become_kubelet_nodes() -> None:
    spec = load_named_stack("sandbox", Path("stacks"))
    nodes = plan_nodes(spec, 6)  # 5 compute + 1 spare
    assert kubelet_node.choose(nodes, 2) == ["gpu-3", "gpu-4"]
    assert kubelet_node.choose(nodes, 0) == []
    with pytest.raises(ValueError, match="the first pool has 5 compute node"):
        kubelet_node.choose(nodes, 6)
    assert kubelet_node.port_names(["gpu-3"]) == (
        "kubelet-gpu-3", "kubelet-gpu-3-healthz", "kubelet-gpu-3-stream")


def test_the_kubelet_registers_the_labels_it_may_set_and_the_rest_are_patched() -> None:
    spec = load_named_stack("sandbox", Path("stacks"))
    node = plan_nodes(spec, 2)[0]
    own, patch = kubelet_node.split_labels(node.labels)
    assert "type" not in own and "type" not in patch  # kwok's own
    assert own["kubernetes.io/hostname"] == node.name and "topology.kubernetes.io/zone" in own
    assert own["nvidia.com/gpu.present"] == "true" and own["gpufleet.io/pool"] == "gpu"
    # Feature discovery's namespace is a subdomain of node.kubernetes.io, which the kubelet may set.
    assert own["feature.node.kubernetes.io/pci-10de.present"] == "true" and patch == {}
    own, patch = kubelet_node.split_labels({"node-role.kubernetes.io/gpu": "", "a.b/c": "d"})
    assert (own, patch) == ({"a.b/c": "d"}, {"node-role.kubernetes.io/gpu": ""})
    assert kubelet_node.gpu_resources(node.capacity) == {"nvidia.com/gpu": "8"}
    assert kubelet_node.kubelet_may_set("x.node.kubernetes.io/y")  # a subdomain of an allowed namespace
    assert not kubelet_node.kubelet_may_set("node-role.kubernetes.io/worker")


def test_ports_and_cgroup_root(tmp_path: Path) -> None:
    nl = layout(tmp_path)
    assert (nl.port, nl.healthz_port, nl.stream_port) == (40001, 40002, 40003)
    assert nl.cgroup == "gpufleet-kube-a1b2c3-gpu-3"
    assert nl.cgroup.startswith(kubelet_node.cgroup_prefix(RUN_ID))


def test_sockets_fit_the_unix_path_limit_under_the_default_state_root() -> None:
    # The longest stack name the repository ships, under the default state root (unix(7): 108 bytes
    # with the terminating NUL).
    longest = max((p.stem.removeprefix("Pulumi.") for p in Path("stacks").glob("Pulumi.*.yaml")), key=len)
    base = Path("/run/gpufleet/sandboxes") / longest / "kubernetes" / "run-a1b2c3"
    node = "gpu-" + "9" * 40  # the folder is named by the index, not the node
    nl = kubelet_node.layout(RUN_ID, base, node, 3, nl_ports(node))
    assert nl.dir.name == "kn3"
    assert kubelet_node.socket_problem(nl) is None
    deep = kubelet_node.layout(RUN_ID, Path("/" + "x" * 100), node, 0, nl_ports(node))
    assert "over the 107 a unix socket path may hold" in str(kubelet_node.socket_problem(deep))


def nl_ports(node: str) -> dict[str, int]:
    return {f"kubelet-{node}": 1, f"kubelet-{node}-healthz": 2, f"kubelet-{node}-stream": 3}


def test_containerd_config_is_toml_with_the_nodes_own_paths(tmp_path: Path) -> None:
    nl = layout(tmp_path)
    doc = tomllib.loads(kubelet_node.containerd_config_text(nl, Path("/b/runc"), Path("/b/cni")))
    assert doc["version"] == 3
    assert doc["root"].startswith(str(nl.dir)) and doc["state"].startswith(str(nl.dir))
    assert doc["grpc"]["address"] == str(nl.socket)
    cri = doc["plugins"]["io.containerd.cri.v1.runtime"]
    assert cri["containerd"]["runtimes"]["runc"]["options"]["BinaryName"] == "/b/runc"
    assert cri["cni"] == {"bin_dirs": ["/b/cni"], "conf_dir": str(nl.cni_conf_dir)}
    assert cri["restrict_oom_score_adj"] is True and cri["netns_mounts_under_state_dir"] is True
    pinned = doc["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]
    assert pinned == {"sandbox": kubelet_node.NODE_IMAGE}
    # exec's streaming server on a fixed port of the node's loopback, which the relay knows
    stream = doc["plugins"]["io.containerd.grpc.v1.cri"]
    assert stream == {"stream_server_address": "127.0.0.1", "stream_server_port": "40003"}


def test_the_stream_relay_reaches_only_containerds_streaming_port_in_the_nodes_namespace(
    tmp_path: Path,
) -> None:
    nl = layout(tmp_path)
    argv = kubelet_node.stream_relay_argv(nl, 4242)
    assert argv[1:3] == ["-m", "gpufleet.sandbox.portforward"]
    assert argv[3:] == ["--netns", "/proc/4242/ns/net", "--target-port", "40003", "--listen-port", "40003",
                        "--port-file", str(nl.dir / "stream-relay.port")]


def test_kubelet_config_leaves_the_host_firewall_alone_and_serves_on_loopback(tmp_path: Path) -> None:
    nl = layout(tmp_path)
    cfg = kubelet_node.kubelet_config(nl, Path("/p/ca.crt"), Path("/p/k.crt"), Path("/p/k.key"))
    assert cfg["makeIPTablesUtilChains"] is False
    assert (cfg["address"], cfg["port"], cfg["healthzBindAddress"], cfg["healthzPort"]) == (
        "127.0.0.1", 40001, "127.0.0.1", 40002)
    assert cfg["cgroupRoot"] == f"/{nl.cgroup}"
    assert cfg["authentication"]["anonymous"] == {"enabled": False}
    assert cfg["authentication"]["x509"] == {"clientCAFile": "/p/ca.crt"}
    assert cfg["authorization"] == {"mode": "Webhook"}
    assert cfg["containerRuntimeEndpoint"] == f"unix://{nl.socket}"
    assert cfg["evictionHard"] == {}  # an empty map, not absent: absent means the defaults


def test_pod_network_stays_in_the_nodes_namespace() -> None:
    conf = kubelet_node.cni_conflist(kubelet_node.pod_subnet(1))
    (bridge,) = conf["plugins"]
    assert bridge["type"] == "bridge" and bridge["ipMasq"] is False
    assert bridge["ipam"] == {"type": "host-local", "ranges": [[{"subnet": "10.143.1.0/24"}]]}


def test_containerd_gets_new_mount_and_network_namespaces_and_the_kubelet_joins_the_mounts(
    tmp_path: Path,
) -> None:
    nl = layout(tmp_path)
    argv = kubelet_node.containerd_argv(nl, Path("/b/containerd"))
    assert argv[:5] == ["unshare", "--mount", "--net", "--propagation", "private"]
    script = argv[7]
    assert script.startswith("ip link set lo up && ") and script.endswith('exec "$0" "$@"')
    for d in kubelet_node.NAMESPACE_TMPFS:
        assert f"mount -t tmpfs -o mode=0755 gpufleet-kubelet {d}" in script
    assert argv[8:] == ["/b/containerd", "--config", str(nl.containerd_config)]

    gpu_taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    k = kubelet_node.kubelet_argv(nl, Path("/b/kubelet"), 4242, {"b": "2", "a": "1"}, [gpu_taint])
    assert k[:4] == ["nsenter", "--mount=/proc/4242/ns/mnt", "--", "/b/kubelet"]  # no --net
    assert "--node-labels=a=1,b=2" in k
    assert ("--register-with-taints=nvidia.com/gpu=present:NoSchedule,"
            f"{kubelet_node.KUBELET_NODE_LABEL}=true:NoSchedule") in k
    assert "--hostname-override=gpu-3" in k


def test_node_certificates_are_the_node_authorizers_identity() -> None:
    client, serving = node_cert_specs("kubelet-0")
    assert (client.common_name, client.organizations, client.client) == (
        "system:node:kubelet-0", ("system:nodes",), True)
    assert serving.server and "127.0.0.1" in serving.ip_addresses


def test_oci_archive_of_a_rootfs(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs.tar"
    with tarfile.open(rootfs, "w") as t:
        data = b"ID=debian\n"
        info = tarfile.TarInfo("etc/os-release")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    out = tmp_path / "image.tar"
    digest = oci_archive.write_archive(rootfs, out, "localhost/x/y:1", ["/bin/sleep", "infinity"])
    with tarfile.open(out) as t:
        files = {m.name: t.extractfile(m).read() for m in t.getmembers() if m.isfile()}  # type: ignore[union-attr]
    index = json.loads(files["index.json"])
    (entry,) = index["manifests"]
    assert entry["digest"] == digest
    assert entry["annotations"]["io.containerd.image.name"] == "localhost/x/y:1"
    manifest = json.loads(files[f"blobs/sha256/{digest.split(':')[1]}"])
    layer_hex = hashlib.sha256(rootfs.read_bytes()).hexdigest()
    assert manifest["layers"] == [{"mediaType": oci_archive.LAYER_TYPE, "digest": f"sha256:{layer_hex}",
                                   "size": rootfs.stat().st_size}]
    assert files[f"blobs/sha256/{layer_hex}"] == rootfs.read_bytes()
    config = json.loads(files[f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"])
    assert config["rootfs"]["diff_ids"] == [f"sha256:{layer_hex}"]
    assert config["config"]["Entrypoint"] == ["/bin/sleep", "infinity"]
    # Every blob is named by its own digest.
    for name, blob in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(blob).hexdigest() == name.rsplit("/", 1)[1]
    assert not out.with_name(out.name + ".partial").exists()


def test_an_image_name_needs_a_tag() -> None:
    with pytest.raises(ValueError, match="no tag"):
        oci_archive.image_documents("localhost/x/y", "sha256:00", 1, ["/bin/true"])


def test_the_python_environment_a_pod_needs_to_run_gpufleet() -> None:
    import sys

    paths = kubelet_node.python_env_paths()
    assert sys.prefix in paths and sys.base_prefix in paths
    assert any((Path(p) / "gpufleet" / "sandbox" / "training" / "smoke.py").is_file() for p in paths)
    argv = kubelet_node.smoke_command("kubelet-0", 8, 2, 0.5)
    assert argv[:3] == [sys.executable, "-m", "gpufleet.sandbox.training.smoke"]
    assert argv[argv.index("--deadline") + 1] == "0.5" and "--standalone" in argv
