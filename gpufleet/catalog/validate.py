"""Validate catalog files or directories given by a user (the CLI's `catalog check`), with the same
per-file parsing and cross-entry checks as `load_catalog`."""

from __future__ import annotations

from pathlib import Path

from gpufleet.catalog.load import Catalog, cross_check, load_catalog, parse_catalog_file
from gpufleet.catalog.model import Fault
from gpufleet.core.errors import InputError


def load_path(path: Path) -> Catalog:
    """A catalog from a directory (every *.yaml) or from one file. Raises InputError."""
    if path.is_dir():
        return load_catalog(path)
    faults = parse_catalog_file(path)
    entries: list[tuple[str, int, Fault]] = [(str(path), i, f) for i, f in enumerate(faults)]
    for file, problems in cross_check(entries).items():
        raise InputError(file, problems)
    return Catalog(tuple(f for _, _, f in entries), {f.id: file for file, _, f in entries})
