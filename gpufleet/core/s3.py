"""One way to speak S3 (boto3), for the storage sandbox, backups, drills and probes.

Settings, each explicit:
- retries: botocore's "standard" mode with a bounded number of attempts (botocore "Retries"
  guide); a drill measures outages, so a caller that must see the first failure passes attempts=1;
- timeouts: connect and read timeouts in seconds, never botocore's 60 s default, so a hung OSD
  shows up as a timeout the caller counts instead of a stalled drill;
- checksums: `when_required` for request and response. botocore 1.36 started sending CRC32
  trailing checksums on every upload by default; Ceph 16's radosgw does not understand them and
  fails uploads (MissingContentLength). Measured on this machine (sandbox-notes.md, Storage).
  Integrity is ours anyway: every checkpoint file is verified by sha256 against its manifest.
- path-style addressing: radosgw on 127.0.0.1 has no DNS name per bucket;
- multipart above MULTIPART_THRESHOLD through boto3's transfer manager (large checkpoints).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from pydantic import BaseModel, ConfigDict

MULTIPART_THRESHOLD = 16 * 1024 * 1024
MULTIPART_CHUNK = 16 * 1024 * 1024
REGION = "us-east-1"  # radosgw's default zonegroup accepts it; SigV4 needs one


def client_config(attempts: int = 3, connect_timeout_s: float = 5.0, read_timeout_s: float = 20.0) -> Config:
    return Config(
        signature_version="s3v4",
        s3={"addressing_style": "path"},
        retries={"max_attempts": attempts, "mode": "standard"},
        connect_timeout=connect_timeout_s,
        read_timeout=read_timeout_s,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        proxies={},  # loopback only: never through a proxy from the environment
    )


def client(
    endpoint: str,
    access_key: str,
    secret_key: str,
    attempts: int = 3,
    connect_timeout_s: float = 5.0,
    read_timeout_s: float = 20.0,
) -> Any:
    """A boto3 S3 client (botocore's client is dynamically typed)."""
    session = boto3.session.Session()
    return session.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name=REGION,
        config=client_config(attempts, connect_timeout_s, read_timeout_s),
    )


def transfer_config() -> TransferConfig:
    return TransferConfig(
        multipart_threshold=MULTIPART_THRESHOLD, multipart_chunksize=MULTIPART_CHUNK, use_threads=False
    )


class S3Location(BaseModel):
    """A place in a bucket and the keys to reach it, as one file of mode 0600
    (core.durable_files.write_private) handed to a process that must write there: a training job's
    checkpoints straight to S3 (ADR 0070), a node's diagnostic bundles shipped off it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoint: str  # as the reader of the file reaches S3 (a node's loopback relay on the sandbox)
    bucket: str
    prefix: str  # ends with "/"
    access_key: str
    secret_key: str

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


def read_location(path: Path) -> S3Location:
    return S3Location.model_validate_json(path.read_text())
