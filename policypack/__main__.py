"""gpufleet policy pack: `pulumi preview --policy-pack policypack` (see docs/pulumi.md).

The checks are plain functions in gpufleet_policies.py; this file only adapts them to
pulumi-policy's validation callbacks.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    PolicyPack,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpufleet_policies import (
    RESOURCE_POLICIES,
    backup_buckets_encrypted_where_supported,
    nccl_env_matches_fabric,
)


def _resource_policy(
    name: str, check: Callable[[str, Mapping[str, Any]], list[str]]
) -> ResourceValidationPolicy:
    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        for message in check(args.resource_type, args.props):
            report_violation(message, args.urn)

    return ResourceValidationPolicy(name=name, description=(check.__doc__ or name).strip(), validate=validate)


def _stack_policy(
    name: str, check: Callable[[list[tuple[str, Mapping[str, Any]]]], list[str]]
) -> StackValidationPolicy:
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        for message in check([(r.resource_type, r.props) for r in args.resources]):
            report_violation(message, None)

    return StackValidationPolicy(name=name, description=(check.__doc__ or name).strip(), validate=validate)


PolicyPack(
    name="gpufleet",
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=[
        *(_resource_policy(n, f) for n, f in RESOURCE_POLICIES.items()),
        _stack_policy("nccl-env-matches-fabric", nccl_env_matches_fabric),
        _stack_policy("backup-buckets-encrypted-where-supported", backup_buckets_encrypted_where_supported),
    ],
)
