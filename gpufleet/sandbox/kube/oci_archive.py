"""An OCI image archive of one layer, from a root filesystem tar: the kubelet nodes' image, which
`ctr images import` loads into their containerd (no registry is reachable here).

The archive is an OCI image layout (image-spec, image-layout.md) in a tar: `oci-layout`,
`index.json` naming the manifest (with the image's name in the `io.containerd.image.name` annotation,
which `ctr images import` takes as the image's name) and the blobs under `blobs/sha256/`: the
manifest, the config and the layer, an uncompressed tar (`application/vnd.oci.image.layer.v1.tar`,
whose diff ID is its own digest).
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONTAINERD_NAME = "io.containerd.image.name"
REF_NAME = "org.opencontainers.image.ref.name"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Blob:
    digest: str  # sha256:<hex>
    data: bytes


def _blob(doc: dict[str, object]) -> Blob:
    data = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return Blob(f"sha256:{hashlib.sha256(data).hexdigest()}", data)


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return f"sha256:{h.hexdigest()}"


def image_documents(name: str, layer_digest: str, layer_size: int,
                    entrypoint: Sequence[str]) -> tuple[Blob, Blob, dict[str, object]]:
    """(config, manifest, index.json) of a one-layer linux/amd64 image (pure)."""
    if ":" not in name.rsplit("/", 1)[-1]:
        raise ValueError(f"image name {name!r} has no tag")
    config = _blob({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": list(entrypoint), "Env": [PATH_ENV]},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    })
    manifest = _blob({
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "digest": config.digest, "size": len(config.data)},
        "layers": [{"mediaType": LAYER_TYPE, "digest": layer_digest, "size": layer_size}],
    })
    index: dict[str, object] = {
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": MANIFEST_TYPE,
            "digest": manifest.digest,
            "size": len(manifest.data),
            "annotations": {CONTAINERD_NAME: name, REF_NAME: name.rsplit(":", 1)[1]},
        }],
    }
    return config, manifest, index


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def write_archive(rootfs_tar: Path, out: Path, name: str, entrypoint: Sequence[str]) -> str:
    """Write the image archive of `rootfs_tar` to `out` (via a temporary file beside it); returns the
    manifest's digest."""
    layer = file_digest(rootfs_tar)
    config, manifest, index = image_documents(name, layer, rootfs_tar.stat().st_size, entrypoint)
    partial = out.with_name(out.name + ".partial")
    with tarfile.open(partial, "w") as tar:
        _add_bytes(tar, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        _add_bytes(tar, "index.json", json.dumps(index, sort_keys=True).encode())
        for blob in (config, manifest):
            _add_bytes(tar, f"blobs/sha256/{blob.digest.split(':', 1)[1]}", blob.data)
        tar.add(rootfs_tar, arcname=f"blobs/sha256/{layer.split(':', 1)[1]}")
    partial.replace(out)
    return manifest.digest
