"""The collective library's environment, derived from the declared fabric by a pure function.

Variable names and values from NCCL's environment-variable documentation and the conventions in
shared/reference/conventions.md: InfiniBand sets the HCA list and the bootstrap interface; RoCE v2
adds the GID index (3 = RoCE v2 over IPv4 on most NICs), traffic class, timeout and retry count; AWS
EFA needs libfabric's provider or NCCL silently falls back to TCP. RCCL (AMD) reads the same NCCL_*
names. Huawei's HCCL has its own names (HCCL_* from the CANN documentation).
"""

from __future__ import annotations

from gpufleet.config.accelerators import Vendor
from gpufleet.config.model import FabricKind, FabricSpec


def collective_environment(fabric: FabricSpec, vendor: Vendor) -> dict[str, str]:
    """Environment variables a training pod needs on this fabric, sorted by name."""
    if vendor is Vendor.HUAWEI:
        env = {
            "HCCL_SOCKET_IFNAME": fabric.mgmt_interface,
            "HCCL_CONNECT_TIMEOUT": str(fabric.connect_timeout_seconds),
            "HCCL_EXEC_TIMEOUT": str(fabric.connect_timeout_seconds),
        }
        if fabric.kind is FabricKind.ROCE:
            env["HCCL_RDMA_TC"] = str(fabric.traffic_class * 4)  # HCCL takes the DSCP<<2 value
        return dict(sorted(env.items()))

    env = {"NCCL_SOCKET_IFNAME": fabric.mgmt_interface}
    if fabric.kind is FabricKind.EFA:
        env |= {"FI_PROVIDER": "efa", "FI_EFA_FORK_SAFE": "1", "FI_EFA_USE_DEVICE_RDMA": "1"}
        return dict(sorted(env.items()))

    hcas = fabric.hca_names()
    # A leading "=" makes NCCL match the listed HCA names exactly, not as prefixes.
    env["NCCL_IB_HCA"] = "=" + ",".join(f"{h}:1" for h in hcas) if fabric.hcas else "mlx5"
    env["NCCL_IB_QPS_PER_CONNECTION"] = str(fabric.qps_per_connection)
    env["NCCL_NET_GDR_LEVEL"] = fabric.gdr_level
    env["NCCL_COLLNET_ENABLE"] = "1" if fabric.sharp else "0"
    env["UCX_NET_DEVICES"] = ",".join(f"{h}:1" for h in hcas)
    if fabric.kind is FabricKind.ROCE:
        env["NCCL_IB_GID_INDEX"] = str(fabric.gid_index)
        env["NCCL_IB_TC"] = str(fabric.traffic_class)
        env["NCCL_IB_TIMEOUT"] = str(fabric.ib_timeout)
        env["NCCL_IB_RETRY_CNT"] = str(fabric.ib_retry_count)
    return dict(sorted(env.items()))
