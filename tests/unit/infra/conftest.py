"""Shared fixtures of the infra tests (helpers live in infra_testdata.py)."""

from __future__ import annotations

import pytest
from infra_testdata import STACK_NAMES, shipped

from gpufleet.config import StackSpec
from gpufleet.infra.offline import OfflinePreview


@pytest.fixture(params=STACK_NAMES)
def stack(request: pytest.FixtureRequest) -> tuple[str, StackSpec, OfflinePreview]:
    spec, view = shipped(request.param)
    return request.param, spec, view
