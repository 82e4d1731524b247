from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from gpufleet.slo import Timeline

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def recorded() -> Callable[[str], Timeline]:
    """Load a recorded timeline (the JSON a recovery-timeline probe returns)."""

    def load(name: str) -> Timeline:
        return Timeline.model_validate(json.loads((FIXTURES / f"{name}.json").read_text()))

    return load
