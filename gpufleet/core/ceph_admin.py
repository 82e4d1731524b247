"""Ceph admin commands against a storage sandbox (`ceph -c <its conf> ... --format json`), once for
the sandbox's bring-up, the chaos backend, its rollbacks and probes."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from gpufleet.core.storage_contract import StorageSandboxState


class CephCommandError(RuntimeError):
    """A `ceph` command failed or did not answer; the message has its argv and stderr."""


def ceph_run(state: StorageSandboxState, *args: str, timeout_s: float = 60.0) -> str:
    argv = state.ceph_command(*args)
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise CephCommandError(f"`{' '.join(argv)}` did not answer in {timeout_s:.0f} s") from None
    if res.returncode != 0:
        err = (res.stderr or res.stdout).strip()[-600:]
        raise CephCommandError(f"`{' '.join(argv)}` failed (exit {res.returncode}): {err}")
    return res.stdout


def ceph_json(state: StorageSandboxState, *args: str, timeout_s: float = 60.0) -> dict[str, Any]:
    out = ceph_run(state, *args, timeout_s=timeout_s)
    try:
        doc = json.loads(out) if out.strip() else {}
    except ValueError as e:
        raise CephCommandError(f"ceph {' '.join(args)}: not JSON: {e}: {out[:200]}") from None
    if not isinstance(doc, dict):
        raise CephCommandError(f"ceph {' '.join(args)}: not a JSON object: {out[:200]}")
    return doc
