"""Checkpoint storage: JuiceFS CSI (+ its Secret and StorageClass) and Rook-Ceph (operator,
CephCluster, block pools, object store).

JuiceFS CSI (juicedata docs, "Create a StorageClass"): the volume credentials live in a Secret with
keys `name`, `metaurl`, `storage`, `bucket`, `access-key`, `secret-key`, referenced by the
StorageClass through the `csi.storage.k8s.io/*-secret-*` parameters; `cache-size` is in MiB.
Rook (CephCluster CRD docs): odd mon count, `mgr.count` <= 2, `network.provider` host|multus,
`disruptionManagement.managePodBudgets` so node drains never take more OSDs than the pools tolerate.
Rook builds the CRUSH hierarchy from `topology.rook.io/*` node labels (its CephCluster docs,
"OSD Topology"): a pool with `failureDomain: rack` needs every OSD node labelled with its rack, so
the stack's `storageNodes` are patched with the OSD selector labels and `topology.rook.io/rack`
(and `gpufleet validate` refuses a pool that its racks cannot place). Storage objects are
`protect`ed outside the sandbox and retained on delete: checkpoints outlive a mistaken destroy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from gpufleet.config.model import CephSpec, JuiceFsSpec, StorageSpec
from gpufleet.infra.charts import CEPH_IMAGE, CHARTS, chart_install, custom_resource
from gpufleet.infra.common import MANAGED_BY, child, secret_input

JUICEFS_PROVISIONER = "csi.juicefs.com"


ROOK_RACK_LABEL = "topology.rook.io/rack"


@dataclass(frozen=True)
class StorageArgs:
    storage: StorageSpec
    protect: bool = True  # refuse deletion of storage objects (False only in the sandbox)
    # Namespaces whose CephObjectStoreUsers the object store accepts (the backups' own).
    user_namespaces: tuple[str, ...] = ()


def storage_node_labels(ceph: CephSpec, rack: str) -> dict[str, str]:
    return {**ceph.osd_node_selector, ROOK_RACK_LABEL: rack}


def juicefs_secret_name(js: JuiceFsSpec) -> str:
    return f"juicefs-{js.name}"


def juicefs_secret_data(js: JuiceFsSpec) -> dict[str, pulumi.Input[str]]:
    """The Secret's string data: credentials as Pulumi secrets, the rest plain."""
    data: dict[str, pulumi.Input[str]] = {
        "name": js.name,
        "metaurl": secret_input(js.meta_url),
        "storage": js.storage,
        "bucket": js.bucket,
    }
    if js.access_key is not None:
        data["access-key"] = secret_input(js.access_key)
    if js.secret_key is not None:
        data["secret-key"] = secret_input(js.secret_key)
    return data


def juicefs_storage_class_parameters(js: JuiceFsSpec, namespace: str) -> dict[str, str]:
    secret = juicefs_secret_name(js)
    return {
        "csi.storage.k8s.io/provisioner-secret-name": secret,
        "csi.storage.k8s.io/provisioner-secret-namespace": namespace,
        "csi.storage.k8s.io/node-publish-secret-name": secret,
        "csi.storage.k8s.io/node-publish-secret-namespace": namespace,
    }


def ceph_cluster_spec(ceph: CephSpec) -> dict[str, Any]:
    storage: dict[str, Any] = {
        "useAllNodes": not ceph.osd_node_selector,
        "useAllDevices": False,
        "deviceFilter": ceph.osd_devices_filter,
    }
    placement: dict[str, Any] = {}
    if ceph.osd_node_selector:
        placement["osd"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": k, "operator": "In", "values": [v]}
                                for k, v in sorted(ceph.osd_node_selector.items())
                            ]
                        }
                    ]
                }
            }
        }
        storage["useAllNodes"] = True  # every node the placement admits; OSDs land only there
    return {
        "cephVersion": {"image": CEPH_IMAGE},
        "dataDirHostPath": "/var/lib/rook",
        "mon": {"count": ceph.mons, "allowMultiplePerNode": False},
        "mgr": {"count": ceph.mgrs},
        "network": {"provider": ceph.network_provider},
        "storage": storage,
        "placement": placement,
        "disruptionManagement": {"managePodBudgets": True},
        "dashboard": {"enabled": True},
        "monitoring": {"enabled": True},
    }


def ceph_object_store_spec(ceph: CephSpec, user_namespaces: tuple[str, ...] = ()) -> dict[str, Any]:
    """Rook's CephObjectStore: metadata pool replicated like the stack's pools; data pool the same,
    or erasure coded (`objectStoreErasureCoded`; Rook's object store docs: the metadata pool must
    stay replicated); `objectStoreGateways` radosgw instances; CephObjectStoreUsers allowed in
    `user_namespaces` (Rook writes their key Secrets there)."""
    replicas = max(p.replicas for p in ceph.pools)
    domain = ceph.pools[0].failure_domain
    ec = ceph.object_store_erasure_coded
    data: dict[str, Any] = (
        {
            "failureDomain": domain,
            "erasureCoded": {"dataChunks": ec.data_chunks, "codingChunks": ec.coding_chunks},
        }
        if ec is not None
        else {"failureDomain": domain, "replicated": {"size": replicas}}
    )
    spec: dict[str, Any] = {
        "metadataPool": {"failureDomain": domain, "replicated": {"size": replicas}},
        "dataPool": data,
        "preservePoolsOnDelete": True,  # checkpoints outlive a mistaken `pulumi destroy`
        "gateway": {"port": 80, "instances": ceph.object_store_gateways},
    }
    if user_namespaces:
        spec["allowUsersInNamespaces"] = list(user_namespaces)
    return spec


class Storage(pulumi.ComponentResource):
    """JuiceFS and/or Rook-Ceph, as the stack declares."""

    def __init__(self, name: str, args: StorageArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpufleet:storage:Storage", name, None, opts)
        st = args.storage
        keep = pulumi.ResourceOptions(parent=self, protect=args.protect, retain_on_delete=True)
        classes: list[pulumi.Output[str]] = []
        self.object_store: k8s.apiextensions.CustomResource | None = None
        if st.ceph is not None:
            ns = CHARTS["rook-ceph"].namespace
            self.storage_nodes = [
                k8s.core.v1.NodePatch(
                    f"{name}-osd-node-{n.name}",
                    metadata=k8s.meta.v1.ObjectMetaPatchArgs(
                        name=n.name, labels=storage_node_labels(st.ceph, n.rack)
                    ),
                    opts=child(self),
                )
                for n in st.ceph.storage_nodes
            ]
            rook = chart_install(f"{name}-rook-ceph", "rook-ceph", {"monitoring": {"enabled": True}}, self)
            self.rook = rook.release
            self.ceph_cluster = custom_resource(
                f"{name}-ceph-cluster",
                "ceph.rook.io/v1",
                "CephCluster",
                {"name": "rook-ceph", "namespace": ns, "labels": MANAGED_BY},
                ceph_cluster_spec(st.ceph),
                pulumi.ResourceOptions.merge(keep, child(self, [*rook.ready, *self.storage_nodes])),
            )
            # Pools and the object store belong to the cluster (Rook refuses them without one).
            after_cluster = [self.ceph_cluster] if self.ceph_cluster is not None else rook.ready
            for pool in st.ceph.pools:
                custom_resource(
                    f"{name}-pool-{pool.name}",
                    "ceph.rook.io/v1",
                    "CephBlockPool",
                    {"name": pool.name, "namespace": ns, "labels": MANAGED_BY},
                    {"failureDomain": pool.failure_domain, "replicated": {"size": pool.replicas}},
                    pulumi.ResourceOptions.merge(keep, child(self, after_cluster)),
                )
            if st.ceph.object_store is not None:
                self.object_store = custom_resource(
                    f"{name}-object-store-{st.ceph.object_store}",
                    "ceph.rook.io/v1",
                    "CephObjectStore",
                    {"name": st.ceph.object_store, "namespace": ns, "labels": MANAGED_BY},
                    ceph_object_store_spec(st.ceph, args.user_namespaces),
                    pulumi.ResourceOptions.merge(keep, child(self, after_cluster)),
                )
        if st.juicefs is not None:
            js = st.juicefs
            ns = CHARTS["juicefs-csi-driver"].namespace
            csi = chart_install(
                f"{name}-juicefs-csi", "juicefs-csi-driver", {"mountMode": js.mount_mode}, self
            )
            self.juicefs_csi = csi.release
            self.juicefs_secret = k8s.core.v1.Secret(
                f"{name}-juicefs-secret",
                metadata={
                    "name": juicefs_secret_name(js),
                    "namespace": ns,
                    "labels": {**MANAGED_BY, "juicefs.com/validate-secret": "true"},
                },
                string_data=juicefs_secret_data(js),
                opts=pulumi.ResourceOptions.merge(
                    keep, pulumi.ResourceOptions(additional_secret_outputs=["data", "stringData"])
                ),
            )
            self.juicefs_class = k8s.storage.v1.StorageClass(
                f"{name}-juicefs-sc",
                metadata={"name": f"juicefs-{js.name}", "labels": MANAGED_BY},
                provisioner=JUICEFS_PROVISIONER,
                parameters=juicefs_storage_class_parameters(js, ns),
                reclaim_policy="Retain",  # deleting a claim must not delete checkpoints
                mount_options=[f"cache-dir={js.cache_dir}", f"cache-size={js.cache_size_gib * 1024}"],
                opts=pulumi.ResourceOptions.merge(keep, child(self, [*csi.ready, self.juicefs_secret])),
            )
            classes.append(self.juicefs_class.metadata.apply(lambda m: str(m.name)))
        # Names as the API server holds them (outputs of the StorageClass resources).
        self.storage_classes: pulumi.Output[list[str]] = pulumi.Output.all(*classes).apply(list)
        self.register_outputs({"storageClasses": self.storage_classes, "checkpoint": st.checkpoint.location})
