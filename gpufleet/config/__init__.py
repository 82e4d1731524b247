"""The stack model (StackSpec): what a cluster is, read from a Pulumi stack file."""

from gpufleet.config.accelerators import (
    AcceleratorModel,
    AcceleratorSpec,
    Vendor,
    accelerator_spec,
    all_specs,
)
from gpufleet.config.load import load_named_stack, load_stack, parse_stack, read_yaml, stack_path
from gpufleet.config.model import (
    Environment,
    FabricKind,
    FabricMode,
    FabricSpec,
    FaultBudget,
    KarpenterProvisioning,
    NodePool,
    SandboxProvisioning,
    SandboxSpec,
    SchedulerKind,
    Secret,
    SloSpec,
    StackSpec,
    StaticProvisioning,
    duration_seconds,
)
from gpufleet.config.nccl import collective_environment

__all__ = [
    "AcceleratorModel",
    "AcceleratorSpec",
    "Environment",
    "FabricKind",
    "FabricMode",
    "FabricSpec",
    "FaultBudget",
    "KarpenterProvisioning",
    "NodePool",
    "SandboxProvisioning",
    "SandboxSpec",
    "SchedulerKind",
    "Secret",
    "SloSpec",
    "StackSpec",
    "StaticProvisioning",
    "Vendor",
    "accelerator_spec",
    "all_specs",
    "collective_environment",
    "duration_seconds",
    "load_named_stack",
    "load_stack",
    "parse_stack",
    "read_yaml",
    "stack_path",
]
