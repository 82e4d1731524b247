"""The node-health check applies the stack's XID overrides handed to it on the command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.catalog import load_catalog
from gpufleet.core.errors import InputError
from gpufleet.core.taxonomy import FaultClass, LadderAction
from gpufleet.health.cli import policy


def test_overrides_given_as_json_change_the_xid_policy() -> None:
    cat = load_catalog()
    plain = policy(cat, None, Path("stacks"))
    table = policy(cat, None, Path("stacks"),
                   '{"13": {"action": "reset-gpu", "reason": "r", "faultClass": "gpu-fatal"}}')
    assert plain[13].action is LadderAction.RESTART_JOB
    assert (table[13].fault_class, table[13].action) == (FaultClass.GPU_FATAL, LadderAction.RESET_GPU)


def test_bad_overrides_are_an_input_error_naming_the_option() -> None:
    with pytest.raises(InputError) as e:
        policy(load_catalog(), None, Path("stacks"), "[1, 2]")
    assert e.value.file == "--xid-overrides"
