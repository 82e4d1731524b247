"""After a metadata restore the engine's slice-id counter moves past every block in the bucket
(core.juicefs says why): block keys read, the highest id found from a few listings in both of
JuiceFS's layouts, and the counter set only when it is too low."""

from __future__ import annotations

import json

import pytest
from memory_s3 import MemoryS3

from gpufleet.core import juicefs as jfs
from gpufleet.core import juicefs_backups as backups
from gpufleet.core.storage_contract import JuiceFsRecord

BLOCK = 4 << 20


def key(volume: str, slice_id: int, block: int = 0, size: int = BLOCK, hashed: bool = False) -> str:
    """A block's object key as JuiceFS 1.4.2 names it (pkg/chunk/cached_store.go, rSlice.key)."""
    if hashed:
        return f"{volume}/chunks/{slice_id % 256:02X}/{slice_id // 10**6}/{slice_id}_{block}_{size}"
    return f"{volume}/chunks/{slice_id // 10**6}/{slice_id // 1000}/{slice_id}_{block}_{size}"


def bucket_with(ids: list[int], hashed: bool = False) -> MemoryS3:
    s3 = MemoryS3(("jfs",))
    s3.put_object(Bucket="jfs", Key="vol/juicefs_uuid", Body=b"u")
    for i in ids:
        s3.put_object(Bucket="jfs", Key=key("vol", i, hashed=hashed), Body=b"x")
        s3.put_object(Bucket="jfs", Key=key("vol", i, 1, 2 << 20, hashed=hashed), Body=b"x")
    return s3


def test_a_block_key_names_its_slice() -> None:
    assert jfs.slice_id_of(key("vol", 1_234_567, 3, 1000)) == 1_234_567
    assert jfs.slice_id_of(key("vol", 77, hashed=True)) == 77
    assert jfs.slice_id_of("vol/juicefs_uuid") is None
    assert jfs.slice_id_of("vol/chunks/0/0/not_a_block") is None
    assert jfs.slice_id_of("metadata/dump-1.json") is None


@pytest.mark.parametrize("hashed", [False, True])
def test_the_highest_slice_is_found_where_text_order_would_miss_it(hashed: bool) -> None:
    # "9" sorts after "10" and "999" after "1000": the folders are compared as numbers.
    ids = [5, 999, 1000, 9_000_001, 10_000_002, 10_000_003, 1_999]
    assert backups.highest_slice_id(bucket_with(ids, hashed), "jfs", "vol", hashed) == 10_000_003
    assert backups.highest_slice_id(bucket_with([3], hashed), "jfs", "vol", hashed) == 3


def test_a_bucket_without_blocks_has_no_highest_slice() -> None:
    assert backups.highest_slice_id(bucket_with([]), "jfs", "vol", False) is None
    assert backups.highest_slice_id(bucket_with([]), "jfs", "vol", True) is None
    # another volume's blocks in the same bucket are not this one's
    s3 = bucket_with([])
    s3.put_object(Bucket="jfs", Key=key("other", 42), Body=b"x")
    assert backups.highest_slice_id(s3, "jfs", "vol", False) is None


def test_the_floor_leaves_room_for_a_batch_a_client_of_the_lost_engine_holds() -> None:
    assert jfs.slice_counter_floor(None) == 1 + jfs.SLICE_ID_BATCH
    assert jfs.slice_counter_floor(500) == 501 + jfs.SLICE_ID_BATCH


def test_the_volume_layout_is_read_from_its_setting() -> None:
    assert jfs.hash_prefixed({"Name": "vol", "HashPrefix": True})
    assert not jfs.hash_prefixed({"Name": "vol"})
    with pytest.raises(ValueError, match="not a JuiceFS volume format"):
        jfs.hash_prefixed(["not", "a", "format"])


REC = JuiceFsRecord(
    name="vol", meta_url="redis://127.0.0.1:6400/1", meta_port=6400, meta_db=1, meta_dir="/nonexistent",
    scratch_port=6401, bucket="jfs", mountpoint="/nonexistent/mnt", cache_dir="/nonexistent/cache",
    cache_mib=64, metrics="127.0.0.1:9567",
)


class FakeRedis:
    """redis-cli GET/SET as jfs.run runs them (the engine's keys in a dict); a missing key prints an
    empty line, as redis-cli does writing to a pipe."""

    def __init__(self, keys: dict[str, str]) -> None:
        self.keys = keys
        self.sets: list[tuple[str, str]] = []

    def run(self, argv: list[str], env: object = None, timeout_s: float = 0) -> str:
        assert argv[:5] == ["redis-cli", "-h", "127.0.0.1", "-p", "6400"] and argv[5:7] == ["-n", "1"], argv
        op, name, *value = argv[7:]
        if op == "GET":
            return self.keys.get(name, "") + "\n"
        assert op == "SET" and len(value) == 1, argv
        self.keys[name] = value[0]
        self.sets.append((name, value[0]))
        return "OK\n"


def test_a_counter_below_the_buckets_blocks_is_moved_past_them(monkeypatch: pytest.MonkeyPatch) -> None:
    redis = FakeRedis({"setting": json.dumps({"Name": "vol"}), "nextchunk": "12"})
    monkeypatch.setattr(jfs, "run", redis.run)
    out = backups.advance_slice_counter(REC, bucket_with([3, 11, 2_345]))
    assert out == {"loaded": 12, "highest_in_bucket": 2_345, "set_to": 2_346 + jfs.SLICE_ID_BATCH}
    assert redis.sets == [("nextchunk", str(2_346 + jfs.SLICE_ID_BATCH))]


def test_a_counter_already_past_them_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    redis = FakeRedis({"setting": json.dumps({"Name": "vol", "HashPrefix": True}), "nextchunk": "90000"})
    monkeypatch.setattr(jfs, "run", redis.run)
    out = backups.advance_slice_counter(REC, bucket_with([3, 11, 2_345], hashed=True))
    assert out == {"loaded": 90_000, "highest_in_bucket": 2_345, "set_to": 90_000}
    assert redis.sets == []


@pytest.mark.parametrize(
    ("keys", "why"),
    [
        ({"nextchunk": "12"}, "volume setting is unreadable"),
        ({"setting": "{not json", "nextchunk": "12"}, "volume setting is unreadable"),
        ({"setting": json.dumps({"Name": "vol"})}, "has no nextchunk counter"),
        ({"setting": json.dumps({"Name": "vol"}), "nextchunk": "-3"}, "has no nextchunk counter"),
    ],
)
def test_an_engine_that_is_not_a_loaded_volume_is_an_error(
    monkeypatch: pytest.MonkeyPatch, keys: dict[str, str], why: str
) -> None:
    redis = FakeRedis(keys)
    monkeypatch.setattr(jfs, "run", redis.run)
    with pytest.raises(jfs.JuiceFsError, match=why):
        backups.advance_slice_counter(REC, bucket_with([3]))
    assert redis.sets == []
