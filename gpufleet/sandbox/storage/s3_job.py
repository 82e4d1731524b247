"""The Slurm sandbox's training job checkpointing straight to S3 (ADR 0070).

When `storage.checkpoint.location` is `s3://<bucket>/<folder>`, the job's checkpoints go to
`<folder>/job-<run id>/` of the storage sandbox's checkpoint bucket, through boto3 from every rank.
The ranks run in the nodes' namespaces, which have no route to the root namespace
(sandbox/network.py); the storage sandbox's radosgw listens on the root namespace's loopback. A
relay (portforward --out-of) listens on port NODE_S3_PORT of each node's own loopback and connects
to radosgw: a rank reaches S3 at http://127.0.0.1:7480 and nothing else of the root namespace. The
nodes' bundle hook ships through the same relay (ADR 0071).
"""

from __future__ import annotations

import sys
from pathlib import Path
from urllib.parse import urlsplit

from gpufleet.config.model import StackSpec
from gpufleet.core.durable_files import write_private
from gpufleet.core.errors import InputError, Problem
from gpufleet.core.s3 import S3Location
from gpufleet.core.s3_job_checkpoints import NODE_S3_PORT, job_prefix, parse_s3_url
from gpufleet.core.storage_contract import StorageSandboxState
from gpufleet.sandbox.processes import Started, spawn

# Where the nodes' diagnostic bundles are shipped in the storage sandbox's backup bucket
# (fleet.bundle.ship).
BUNDLE_PREFIX = "bundles/"


def radosgw_port(storage: StorageSandboxState | None) -> int | None:
    """The storage sandbox's radosgw port on the root namespace's loopback, when it is up."""
    if storage is None or storage.phase != "up" or storage.s3_endpoint is None:
        return None
    return urlsplit(storage.s3_endpoint).port


def bundle_target(storage: StorageSandboxState | None) -> S3Location | None:
    """Where the nodes ship their diagnostic bundles: `bundles/` of the storage sandbox's backup
    bucket through the relay, when the storage sandbox is up; None otherwise (bundles stay on the
    node, in the run folder)."""
    if radosgw_port(storage) is None or storage is None or storage.backup_bucket is None:
        return None
    creds = storage.credentials()
    return S3Location(endpoint=f"http://127.0.0.1:{NODE_S3_PORT}", bucket=storage.backup_bucket,
                      prefix=BUNDLE_PREFIX, access_key=creds.access_key, secret_key=creds.secret_key)


def job_target(
    stack_name: str, spec: StackSpec, storage: StorageSandboxState | None, run_id: str
) -> S3Location | None:
    """Where the job checkpoints when the stack's location is `s3://`, as the ranks reach it (their
    loopback's relay), else None. InputError when the location is malformed, names another bucket
    than the storage sandbox's, or the storage sandbox is not up: never a silent fallback to a
    local folder."""
    loc = spec.storage.checkpoint.location
    if not loc.startswith("s3://"):
        return None
    parsed = parse_s3_url(loc)
    if parsed is None:
        raise InputError(f"stack {stack_name}", [
            Problem("storage.checkpoint.location", f"{loc!r}: expected s3://<bucket>/<folder>")])
    bucket, folder = parsed
    if storage is None or radosgw_port(storage) is None:
        raise InputError(f"stack {stack_name}", [
            Problem("storage.checkpoint.location",
                    f"{loc!r}: the training job checkpoints on the storage sandbox's object store, which "
                    f"is not up: run `gpufleet sandbox up --storage --stack {stack_name}` first")])
    if bucket != storage.checkpoint_bucket:
        raise InputError(f"stack {stack_name}", [
            Problem("storage.checkpoint.location",
                    f"{loc!r} names bucket {bucket!r}; the storage sandbox's checkpoint bucket is "
                    f"{storage.checkpoint_bucket!r} (storage.ceph.objectStore)")])
    creds = storage.credentials()
    return S3Location(endpoint=f"http://127.0.0.1:{NODE_S3_PORT}", bucket=bucket,
                      prefix=job_prefix(folder, run_id), access_key=creds.access_key,
                      secret_key=creds.secret_key)


def write_location(path: Path, location: S3Location) -> None:
    """A location file for the nodes (the ranks', the bundle hook's), mode 0600: it holds the S3
    user's keys."""
    write_private(path, location.model_dump_json(indent=2) + "\n")


def start_relay(namespaces: list[str], radosgw_port: int, port_file: Path, log: Path,
                python: str = sys.executable) -> Started:
    """One process relaying NODE_S3_PORT of every namespace's loopback to radosgw (the job's
    checkpoints, the nodes' bundles)."""
    argv = [python, "-m", "gpufleet.sandbox.portforward", "--listen-port", str(NODE_S3_PORT),
            "--target-port", str(radosgw_port), "--port-file", str(port_file)]
    for ns in namespaces:
        argv += ["--out-of", ns]
    return spawn("portforward@radosgw", argv, log)
