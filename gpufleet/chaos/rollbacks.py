"""Named rollbacks: the ledger stores a name and arguments; this table maps names to functions."""

from __future__ import annotations

from typing import Any

from gpufleet.chaos.backends import kubernetes as k8s
from gpufleet.chaos.backends import sandbox_undo, slurm, slurm_state_fault, storage_undo
from gpufleet.chaos.ledger import RollbackFn


def _noop(args: dict[str, Any]) -> None:
    """Nothing to undo (the fault ends by itself, e.g. a killed rank is restarted by the workload)."""


ROLLBACKS: dict[str, RollbackFn] = {
    "noop": _noop,
    "sandbox.agent-clear": sandbox_undo.rb_agent_clear,
    "sandbox.link-up": sandbox_undo.rb_link_up,
    "sandbox.link-restore": sandbox_undo.rb_link_restore,
    "sandbox.continue": sandbox_undo.rb_continue,
    "sandbox.reboot-hung": sandbox_undo.rb_reboot_hung,
    "sandbox.restart-daemons": sandbox_undo.rb_restart_daemons,
    "sandbox.replica-restore": sandbox_undo.rb_replica_restore,
    "sandbox.storage-restore": sandbox_undo.rb_storage_restore,
    "sandbox.host-restore": sandbox_undo.rb_host_restore,
    "sandbox.links-up": sandbox_undo.rb_links_up,
    "sandbox.nic-restore": sandbox_undo.rb_nic_restore,
    "sandbox.slurm-state-restore": slurm_state_fault.rb_slurm_state_restore,
    "slurm.ssh": slurm.rb_ssh,
    "storage.restart-daemon": storage_undo.rb_restart_daemon,
    "storage.continue-daemon": storage_undo.rb_continue_daemon,
    "storage.full-ratios": storage_undo.rb_full_ratios,
    "storage.restore-bucket": storage_undo.rb_restore_bucket,
    "storage.restore-metadata": storage_undo.rb_restore_metadata,
    "storage.remount": storage_undo.rb_remount,
    "storage.thrash-revert": storage_undo.rb_thrash_revert,
    "kubernetes.uncordon": k8s.rb_uncordon,
    "kubernetes.untaint": k8s.rb_untaint,
    "kubernetes.pod-undo": k8s.rb_run_pod_and_cleanup,
    "kubernetes.node-condition": k8s.rb_node_condition,
    "kubernetes.lease-release": k8s.rb_lease_release,
}
