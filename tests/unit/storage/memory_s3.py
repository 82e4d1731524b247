"""An in-memory double of the boto3 S3 calls the checkpoint stores make (upload_file,
upload_fileobj, put_object, get_object, list_objects_v2 pages with or without a delimiter,
delete_object), raising botocore's ClientError as radosgw answers for a missing key or bucket.
Tests that need the real thing run against radosgw (tests/e2e)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError


def _error(code: str, op: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}}, op)


class MemoryS3:
    def __init__(self, buckets: tuple[str, ...] = ("ckpt",)) -> None:
        self.buckets = set(buckets)
        self.objects: dict[tuple[str, str], bytes] = {}
        self.puts: list[str] = []  # keys in the order they were written

    def _bucket(self, bucket: str, op: str) -> None:
        if bucket not in self.buckets:
            raise _error("NoSuchBucket", op)

    def head_bucket(self, Bucket: str) -> None:
        self._bucket(Bucket, "HeadBucket")

    def create_bucket(self, Bucket: str) -> None:
        self.buckets.add(Bucket)

    def put_object(self, Bucket: str, Key: str, Body: bytes) -> None:
        self._bucket(Bucket, "PutObject")
        self.objects[(Bucket, Key)] = bytes(Body)
        self.puts.append(Key)

    def upload_file(self, filename: str, bucket: str, key: str) -> None:
        self.put_object(Bucket=bucket, Key=key, Body=Path(filename).read_bytes())

    def upload_fileobj(self, fileobj: Any, bucket: str, key: str, Config: Any = None) -> None:
        self.put_object(Bucket=bucket, Key=key, Body=fileobj.read())

    def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        self._bucket(Bucket, "GetObject")
        if (Bucket, Key) not in self.objects:
            raise _error("NoSuchKey", "GetObject")
        return {"Body": io.BytesIO(self.objects[(Bucket, Key)])}

    def delete_object(self, Bucket: str, Key: str) -> None:
        self._bucket(Bucket, "DeleteObject")
        self.objects.pop((Bucket, Key), None)

    def get_paginator(self, _name: str) -> Any:
        store = self

        class Pages:
            def paginate(self, Bucket: str, Prefix: str, Delimiter: str = "") -> list[dict[str, Any]]:
                store._bucket(Bucket, "ListObjectsV2")
                keys = sorted(k for b, k in store.objects if b == Bucket and k.startswith(Prefix))
                if not Delimiter:
                    return [{"Contents": [{"Key": k} for k in keys]}]
                # S3: a key with the delimiter past the prefix rolls up into its common prefix.
                rest = [(k, k[len(Prefix):].find(Delimiter)) for k in keys]
                folders = sorted({k[: len(Prefix) + i + 1] for k, i in rest if i >= 0})
                return [{"Contents": [{"Key": k} for k, i in rest if i < 0],
                         "CommonPrefixes": [{"Prefix": f} for f in folders]}]

        return Pages()
