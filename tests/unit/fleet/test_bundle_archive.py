"""The archive and its manifest: every member's size and sha256, the total cap dropping later
members (recorded), and verification catching any disagreement; a file that is not a bundle is a
clear error."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from gpufleet.fleet.bundle.archive import (
    BundleError,
    bundle_name,
    members,
    read_manifest,
    verify,
    write_bundle,
)
from gpufleet.fleet.bundle.collect import Request, collect
from gpufleet.fleet.bundle.model import MANIFEST_NAME, Caps, Manifest, Member
from gpufleet.fleet.bundle.runner import Collector, Output

TWO = {"a": Output(b"alpha", "ok", 0, 0.1), "b": Output(b"beta", "ok", 0, 0.1)}
CAPS = Caps(collector_timeout_s=5, collector_bytes=100, total_bytes=250, deadline_s=10)


def _c(name: str) -> Collector:
    return Collector(name, f"{name}.txt", ["cmd", name])


def _manifest(records: list[Member], at: float = 1_765_000_000.5) -> Manifest:
    return Manifest(node="gpu-1", stack="sandbox", source="sandbox", trigger="manual", started_at=at,
                    finished_at=at + 1, caps=CAPS, members=records)


def test_members_record_hash_size_and_drop_what_passes_the_total_cap() -> None:
    cs = [_c("a"), _c("b"), _c("c"), _c("empty")]
    outs = {"a": Output(b"a" * 100, "ok", 0, 0.1),
            "b": Output(b"b" * 100, "failed", 1, 0.2, error="exit status 1"),
            "c": Output(b"c" * 100, "ok", 0, 0.3, truncated=True),
            "empty": Output(b"", "timeout", None, 5.0, error="killed after 5 s")}
    records, files = members(cs, outs, CAPS)
    assert list(files) == ["a.txt", "b.txt"]
    a, b, c, empty = records
    assert (a.name, a.size, a.sha256, a.exit_status, a.command) == (
        "a.txt", 100, hashlib.sha256(b"a" * 100).hexdigest(), 0, ["cmd", "a"])
    assert (b.status, b.error) == ("failed", "exit status 1")  # a failed command's output is kept
    assert c.status == "dropped" and c.name is None and c.size == 0 and c.truncated
    assert c.error is not None and "250-byte cap" in c.error and "was ok" in c.error
    assert (empty.name, empty.status, empty.error) == (None, "timeout", "killed after 5 s")


def test_written_bundle_verifies_and_reads_back(tmp_path: Path) -> None:
    cs = [_c("a"), _c("b")]
    records, files = members(cs, TWO, CAPS)
    path = write_bundle(tmp_path, _manifest(records), files)
    assert path.name == "bundle-gpu-1-20251206T054640500Z-manual.tar.gz"
    manifest, problems = verify(path)
    assert problems == [] and manifest.members == records
    assert read_manifest(path) == manifest
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left


def _rewrite(path: Path, change: dict[str, bytes | None]) -> None:
    with tarfile.open(path) as tar:
        items = {i.name: tar.extractfile(i).read() for i in tar}  # type: ignore[union-attr]
    for k, v in change.items():
        if v is None:
            items.pop(k)
        else:
            items[k] = v
    with tarfile.open(path, "w:gz") as tar:
        for k, v in items.items():
            info = tarfile.TarInfo(k)
            info.size = len(v)
            tar.addfile(info, io.BytesIO(v))


def test_verify_names_every_disagreement(tmp_path: Path) -> None:
    cs = [_c("a"), _c("b")]
    records, files = members(cs, TWO, CAPS)
    path = write_bundle(tmp_path, _manifest(records), files)
    _rewrite(path, {"a.txt": b"alphA", "b.txt": None, "extra.txt": b"x"})
    _, problems = verify(path)
    assert problems == [
        f"a.txt: sha256 {hashlib.sha256(b'alphA').hexdigest()}, the manifest says "
        f"{hashlib.sha256(b'alpha').hexdigest()}",
        "b.txt: listed in the manifest, absent from the archive",
        "extra.txt: in the archive, not in the manifest",
    ]


def test_a_file_that_is_not_a_bundle_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="no such file"):
        verify(tmp_path / "absent.tar.gz")
    junk = tmp_path / "junk.tar.gz"
    junk.write_text("not an archive")
    with pytest.raises(BundleError, match="not a gzip-compressed tar archive"):
        verify(junk)
    empty = tmp_path / "empty.tar.gz"
    with tarfile.open(empty, "w:gz"):
        pass
    with pytest.raises(BundleError, match=f"no {MANIFEST_NAME} in the archive"):
        verify(empty)
    bad = tmp_path / "bad.tar.gz"
    with tarfile.open(bad, "w:gz") as tar:
        data = b'{"version": 1, "node": "n"}'
        info = tarfile.TarInfo(MANIFEST_NAME)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(BundleError, match=r"bad.tar.gz: manifest.json: stack: Field required"):
        verify(bad)


def test_collect_writes_one_bundle_with_every_collector_recorded(tmp_path: Path) -> None:
    import sys

    cs = [Collector("ok", "ok.txt", [sys.executable, "-c", "print('fine')"]),
          Collector("missing", "missing.txt", ["no-such-tool-gpufleet"])]
    req = Request(node="n1", stack=None, source="nvidia", trigger="manual", reason="test", detected_at=5.0)
    path, manifest = collect(req, cs, CAPS, tmp_path)
    assert [m.status for m in manifest.members] == ["ok", "failed"]
    assert manifest.reason == "test" and manifest.detected_at == 5.0
    assert verify(path) == (manifest, [])
    with pytest.raises(ValueError, match="unique"):
        collect(req, [cs[0], cs[0]], CAPS, tmp_path)


def test_bundle_names_sort_by_time() -> None:
    assert bundle_name("gpu-0", "node-health", 1.25) == "bundle-gpu-0-19700101T000001250Z-node-health.tar.gz"
    assert bundle_name("n", "t", 100.0) < bundle_name("n", "t", 100.5)
