"""The diagnostic bundles an experiment's fault caused (docs/diagnostic-bundles.md), copied into the
game-day report so they outlive the sandbox (whose run directory `sandbox down` removes) and linked
from the experiment's section."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from gpufleet.core.sandbox_contract import read_kube_state, read_state
from gpufleet.fleet.bundle.archive import BundleError, read_manifest

BUNDLES_DIR = "bundles"  # under the sandbox's run directory and under the report directory


def sandbox_bundle_dir(stack: str, backend: str = "sandbox") -> Path | None:
    """Where the stack's running sandbox writes bundles (the Slurm sandbox's node-health hook; the
    Kubernetes sandbox's remediation, before a quarantine); None without a sandbox."""
    try:
        base = read_kube_state(stack).base_dir if backend == "kubernetes" else read_state(stack).base_dir
    except (OSError, ValueError):
        return None
    return Path(base) / BUNDLES_DIR


def collect_for_report(source: Path | None, since: float, report_dir: Path) -> list[dict[str, Any]]:
    """Bundles started at or after `since`, copied to <report_dir>/bundles; one entry per bundle for
    the report: its path relative to the report, node, reason, size and every collector not ok.
    A file that is not a readable bundle is listed with its error, never skipped in silence."""
    if source is None or not source.is_dir():
        return []
    out: list[dict[str, Any]] = []
    dest = report_dir / BUNDLES_DIR
    for path in sorted(source.glob("bundle-*.tar.gz")):
        try:
            manifest = read_manifest(path)
        except BundleError as e:
            out.append({"path": None, "node": None, "error": str(e)})
            continue
        if manifest.started_at < since:
            continue
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest / path.name)
        out.append({
            "path": f"{BUNDLES_DIR}/{path.name}", "node": manifest.node, "reason": manifest.reason,
            "bytes": path.stat().st_size, "seconds": round(manifest.finished_at - manifest.started_at, 2),
            "not_ok": [f"{m.collector}: {m.status}" for m in manifest.members if m.status != "ok"],
        })
    return out
