"""The stack's version pins (upgrade.driverVersion / firmwareVersion) and sandbox.badVersions."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpufleet.config import UpgradeSpec
from gpufleet.config.model import SandboxSpec


def test_pins_default_to_unpinned_and_take_versions() -> None:
    assert UpgradeSpec().driver_version is None and UpgradeSpec().firmware_version is None
    spec = UpgradeSpec.model_validate({"driverVersion": "570.124.06", "firmwareVersion": "96.00.9F.00.04"})
    assert (spec.driver_version, spec.firmware_version) == ("570.124.06", "96.00.9F.00.04")


@pytest.mark.parametrize("bad", ["", "-x", "a b", "x" * 65])
def test_a_pin_that_is_not_a_version_is_refused_with_its_key(bad: str) -> None:
    with pytest.raises(ValidationError) as e:
        UpgradeSpec.model_validate({"driverVersion": bad})
    assert e.value.errors()[0]["loc"] == ("driverVersion",)
    with pytest.raises(ValidationError) as e2:
        SandboxSpec.model_validate({"badVersions": ["ok-1", bad]})
    assert e2.value.errors()[0]["loc"] == ("badVersions", 1)
