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

from gpufleet_policies import RESOURCE_POLICIES, nccl_env_matches_fabric


def _resource_policy(
    name: str, check: Callable[[str, Mapping[str, Any]], list[str]]
) -> ResourceValidationPolicy:
    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        for message in check(args.resource_type, args.props):
            report_violation(message, args.urn)

    return ResourceValidationPolicy(name=name, description=(check.__doc__ or name).strip(), validate=validate)


def _validate_stack(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    for message in nccl_env_matches_fabric([(r.resource_type, r.props) for r in args.resources]):
        report_violation(message, None)


PolicyPack(
    name="gpufleet",
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=[
        *(_resource_policy(n, f) for n, f in RESOURCE_POLICIES.items()),
        StackValidationPolicy(
            name="nccl-env-matches-fabric",
            description=(nccl_env_matches_fabric.__doc__ or "").strip(),
            validate=_validate_stack,
        ),
    ],
)
