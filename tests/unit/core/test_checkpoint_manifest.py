"""The checkpoint manifest: complete and intact is decided by sha256 of every file, never by size;
the newest checkpoint that verifies is chosen, incomplete and corrupt ones are skipped."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpufleet.core.checkpoint_manifest import (
    Candidate,
    CheckpointManifest,
    build_manifest,
    choose_newest_verified,
    parse_manifest,
    parse_stem,
    sha256_bytes,
    stem,
    verify,
)

names = st.from_regex(r"[a-z][a-z0-9_.-]{0,12}", fullmatch=True)
shard_sets = st.dictionaries(names, st.binary(max_size=256), min_size=1, max_size=5)


def _manifest(shards: dict[str, bytes], meta: bytes = b'{"step": 1}', step: int = 1) -> CheckpointManifest:
    shards = {k: v for k, v in shards.items() if k != "meta"}
    return build_manifest(7, 0, step, shards or {"s": b""}, ("meta", meta), 1000.0)


def _reader(files: dict[str, bytes]) -> object:
    return lambda n: sha256_bytes(files[n]) if n in files else None


@given(shard_sets, st.binary(max_size=64))
def test_an_intact_checkpoint_verifies_and_round_trips(shards: dict[str, bytes], meta: bytes) -> None:
    m = _manifest(shards, meta)
    files = {f.name: (meta if f.name == "meta" else shards.get(f.name, b"")) for f in m.files()}
    assert verify(m, _reader(files)) == []  # type: ignore[arg-type]
    assert parse_manifest(m.to_bytes()) == m


@given(shard_sets, st.data())
def test_any_changed_byte_is_caught_even_at_the_same_size(
    shards: dict[str, bytes], data: st.DataObject
) -> None:
    m = _manifest(shards)
    files = {f.name: (b'{"step": 1}' if f.name == "meta" else shards.get(f.name, b"")) for f in m.files()}
    victim = data.draw(st.sampled_from(sorted(n for n, b in files.items() if b)) if any(files.values())
                       else st.just(None))
    if victim is None:
        return
    raw = bytearray(files[victim])
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= 1 << data.draw(st.integers(0, 7))  # one flipped bit, size unchanged
    files[victim] = bytes(raw)
    problems = verify(m, _reader(files))  # type: ignore[arg-type]
    assert len(problems) == 1 and problems[0].startswith(f"{victim}: sha256")


def test_a_missing_file_is_named() -> None:
    m = _manifest({"model": b"w", "optim": b"o"})
    files = {"model": b"w", "meta": b'{"step": 1}'}
    assert verify(m, _reader(files)) == ["optim: missing"]  # type: ignore[arg-type]


def test_parse_rejects_what_is_not_a_manifest() -> None:
    good = _manifest({"a": b"1"})
    assert "not JSON" in str(parse_manifest(b"{torn"))
    assert "format" in str(parse_manifest(b'{"format": 1}'))
    doc = good.model_dump(mode="json")
    doc["shards"][0]["name"] = "../escape"
    import json

    assert "shards.0.name" in str(parse_manifest(json.dumps(doc).encode()))
    doc = good.model_dump(mode="json")
    doc["shards"] = []
    assert "shards" in str(parse_manifest(json.dumps(doc).encode()))
    doc = good.model_dump(mode="json")
    doc["metadata"]["name"] = doc["shards"][0]["name"]
    assert "twice" in str(parse_manifest(json.dumps(doc).encode()))


_kinds = st.sampled_from(["ok", "incomplete", "corrupt"])


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 50), _kinds), max_size=12,
                unique_by=lambda t: (t[0], t[1])))
def test_the_newest_verified_checkpoint_is_chosen(specs: list[tuple[int, int, str]]) -> None:
    cands = []
    for restart, step, kind in specs:
        m = None if kind == "incomplete" else _manifest({"s": kind.encode()}, step=step)
        cands.append(Candidate((1, restart, step), m, None if m else "incomplete: no manifest"))
    choice = choose_newest_verified(cands, lambda m: ["bad"] if m.shards[0].sha256 == sha256_bytes(b"corrupt")
                                    else [])
    good = [(1, r, s) for r, s, k in specs if k == "ok"]
    assert (choice.chosen.key if choice.chosen else None) == (max(good) if good else None)
    newer = sorted((k for k in ((1, r, s) for r, s, _ in specs) if not good or k > max(good)), reverse=True)
    assert [k for k, _ in choice.skipped] == newer


def test_stems_sort_by_generation_then_step() -> None:
    assert parse_stem(stem((12, 3, 400))) == (12, 3, 400)
    assert stem((1, 2, 3)) < stem((1, 3, 0)) < stem((2, 0, 0))
    assert parse_stem("ckpt-1-2-3") is None
