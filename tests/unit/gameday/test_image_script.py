"""tools/image/gameday.py without a container builder: it says exactly why it cannot build (exit 3),
which is the reason tests/e2e/test_gameday_image.py skips with; and the constraints it hands pip."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "tools" / "image" / "gameday.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpufleet_image_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_check_without_builder_names_what_is_missing(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path)}  # no buildah, no debootstrap
    res = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, env=env,
                         check=False)
    assert res.returncode == 3
    assert "cannot build here: no buildah and no debootstrap on PATH" in res.stderr


def test_constraints_leave_out_gpufleet_and_broken_pins(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = _script()

    def fake_run(argv: list[str], what: str, cwd: Path | None = None, capture: bool = False) -> str:
        return "gpufleet==0.1.0\nkubernetes==37.0.2\npydantic==2.14.4\n-e git+x#egg=y\n"

    class Check:
        stdout = "kubernetes 37.0.2 has requirement python-dateutil>=3.0.0, but you have 2.9.0.\n"

    monkeypatch.setattr(mod, "run", fake_run)
    monkeypatch.setattr(mod.subprocess, "run", lambda *a, **k: Check())
    assert mod.constraints() == "pydantic==2.14.4\n"
