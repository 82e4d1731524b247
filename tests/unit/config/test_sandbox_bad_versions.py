"""sandbox.badVersions: versions the sandbox's fake GPUs fail to load under (paths of a bad value)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpufleet.config.model import SandboxSpec


def test_bad_versions_default_to_none_and_take_versions() -> None:
    assert SandboxSpec().bad_versions == []
    assert SandboxSpec.model_validate({"badVersions": ["560.0.0-bad"]}).bad_versions == ["560.0.0-bad"]


@pytest.mark.parametrize("bad", ["", "-x", "a b", "x" * 65])
def test_a_value_that_is_not_a_version_is_refused_with_its_path(bad: str) -> None:
    with pytest.raises(ValidationError) as e:
        SandboxSpec.model_validate({"badVersions": ["ok-1", bad]})
    assert e.value.errors()[0]["loc"] == ("badVersions", 1)
