"""An S3 oracle: a client that writes objects to radosgw and checks every read against what it wrote.

It runs in a thread beside the OSD thrasher: each round PUTs a new object of seeded random bytes
(remembering its sha256), GETs it back, and GETs one older object chosen at random; every body read
is compared by sha256 with what was written under that key. A failed request is recorded with when
it started and ended (the thrasher decides whether a change accounts for it) and retried until it
succeeds: a PUT whose outcome is unknown is written again with the same bytes, so the key's expected
content never changes. At the end `verify_all` reads back every object once more.
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from gpufleet.core import s3
from gpufleet.core.storage_contract import StorageSandboxState

# The oracle's requests: one attempt each (a failure is seen, counted and retried by the oracle, not
# hidden by botocore's retries) and a 10 s read timeout, as the sandbox's other S3 clients
# (core.s3_checkpoints.store_for): a PG that peers longer than that shows up as a timeout.
READ_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class OracleError:
    op: str  # put | get
    key: str
    started: float
    ended: float
    error: str


@dataclass
class OracleTally:
    writes: int = 0
    reads: int = 0
    mismatches: list[str] = field(default_factory=list)  # keys whose body differed from the write
    unrecovered: list[str] = field(default_factory=list)  # requests that never succeeded (gave up)
    errors: list[OracleError] = field(default_factory=list)

    def to_doc(self) -> dict[str, Any]:
        return {
            "writes": self.writes,
            "reads": self.reads,
            "mismatches": list(self.mismatches),
            "unrecovered": list(self.unrecovered),
            "errors": len(self.errors),
        }


class S3Oracle:
    def __init__(
        self,
        state: StorageSandboxState,
        bucket: str,
        prefix: str,
        seed: int,
        object_bytes: int = 64 * 1024,
        pause_s: float = 0.2,
        give_up_s: float = 120.0,
    ) -> None:
        creds = state.credentials()
        if state.s3_endpoint is None:
            raise RuntimeError(f"the storage sandbox of {state.stack} has no S3 endpoint")
        self.client = s3.client(
            state.s3_endpoint,
            creds.access_key,
            creds.secret_key,
            attempts=1,
            connect_timeout_s=CONNECT_TIMEOUT_S,
            read_timeout_s=READ_TIMEOUT_S,
        )
        self.bucket = bucket
        self.prefix = prefix
        self.rng = random.Random(seed)
        self.object_bytes = object_bytes
        self.pause_s = pause_s
        self.give_up_s = give_up_s  # a request still failing after this is unrecovered (a failure)
        self.written: dict[str, str] = {}  # key -> sha256 hex of what was written
        self.tally = OracleTally()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="s3-oracle", daemon=True)

    # ------------------------------------------------------------ one request, retried
    def _put(self, key: str, body: bytes) -> None:
        give_up = time.monotonic() + self.give_up_s
        while time.monotonic() < give_up:
            t0 = time.time()
            try:
                self.client.put_object(Bucket=self.bucket, Key=key, Body=body)
            except Exception as e:  # any S3 or connection failure: recorded, then retried
                self._failed("put", key, t0, e)
                continue
            with self._lock:
                self.tally.writes += 1
            return
        with self._lock:
            self.tally.unrecovered.append(f"put {key}")

    def _get(self, key: str) -> None:
        give_up = time.monotonic() + self.give_up_s
        while time.monotonic() < give_up:
            t0 = time.time()
            try:
                body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
            except Exception as e:
                self._failed("get", key, t0, e)
                continue
            with self._lock:
                self.tally.reads += 1
                if hashlib.sha256(body).hexdigest() != self.written[key]:
                    self.tally.mismatches.append(key)
            return
        with self._lock:
            self.tally.unrecovered.append(f"get {key}")

    def _failed(self, op: str, key: str, t0: float, e: Exception) -> None:
        with self._lock:
            self.tally.errors.append(OracleError(op, key, t0, time.time(), f"{type(e).__name__}: {e}"[:300]))
        time.sleep(0.5)  # then retry

    # ------------------------------------------------------------ the loop
    def _loop(self) -> None:
        n = 0
        while not self._stop.is_set():
            key = f"{self.prefix}{n:06d}"
            body = self.rng.randbytes(self.object_bytes)
            self.written[key] = hashlib.sha256(body).hexdigest()
            self._put(key, body)
            self._get(key)
            if n:
                self._get(f"{self.prefix}{self.rng.randrange(n):06d}")
            n += 1
            self._stop.wait(self.pause_s)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 60.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def verify_all(self) -> None:
        """Read every object written back once more (after the thrash, with the cluster clean)."""
        for key in sorted(self.written):
            self._get(key)

    def delete_all(self) -> None:
        # One DELETE per object: DeleteObjects needs a checksum header Ceph 16 does not know (core.s3).
        for key in sorted(self.written):
            self.client.delete_object(Bucket=self.bucket, Key=key)
