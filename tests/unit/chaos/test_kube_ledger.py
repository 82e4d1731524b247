"""The fault ledger in a ConfigMap: its keys, pruning, and the exact requests it sends (against the
local HTTP stand-in; tests/e2e/test_kube_ledger.py runs it on the real API server)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from chaoslib.exceptions import InvalidActivity

from gpufleet.chaos import engine
from gpufleet.chaos.backends.kube_ledger import (
    MERGE,
    ConfigMapStore,
    entry_key,
    entry_value,
    objects_of,
    prunable,
)
from gpufleet.chaos.backends.kubernetes import connection
from gpufleet.chaos.ledger import FaultRecord, Ledger, Rollback, revert_pending
from gpufleet.core.ledger_location import configmap_location

PATH = "/api/v1/namespaces/gd/configmaps"


def _rec(i: int, at: float, **kw: Any) -> FaultRecord:
    return FaultRecord(kind="cordon", backend="kubernetes", target={"node": f"gpu-{i}"},
                       rollback=Rollback("test.touch", {"n": i}), at=at, **kw)


def _data(*objs: dict[str, Any]) -> dict[str, str]:
    return {entry_key(o): entry_value(o) for o in objs}


def _cm(data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "led", "namespace": "gd"},
            "data": data}


def test_locations() -> None:
    assert configmap_location("/var/lib/gpufleet/ledger/faults.jsonl") is None
    assert configmap_location("configmap://gd/led") == ("gd", "led")
    for bad in ("configmap://gd", "configmap:///led", "configmap://gd/led/x"):
        with pytest.raises(ValueError, match="expected configmap://<namespace>/<name>"):
            configmap_location(bad)


def test_keys_sort_in_append_order_and_never_collide() -> None:
    a = _rec(1, 999.5).to_json()
    b = _rec(2, 1000.25).to_json()  # one more digit before the point: still sorts after
    rev = {"op": "reverted", "id": a["id"], "at": 1001.0, "ok": True, "error": None}
    keys = [entry_key(o) for o in (a, b, rev)]
    assert sorted(keys) == keys and len(set(keys)) == 3
    assert [o["id"] for o in objects_of(dict(reversed(list(_data(a, b, rev).items()))))] == [
        a["id"], b["id"], a["id"]]


def test_objects_skip_an_unreadable_value() -> None:
    a = _rec(1, 1.0).to_json()
    assert objects_of({**_data(a), "0-x-apply": "{not json"}) == [a]
    assert objects_of(None) == []


def test_prune_drops_the_oldest_reverted_faults_and_never_a_pending_one() -> None:
    old = _rec(1, 1.0).to_json()
    old_rev = {"op": "reverted", "id": old["id"], "at": 2.0, "ok": True, "error": None}
    pending = _rec(2, 3.0).to_json()
    failed_rev = {"op": "reverted", "id": pending["id"], "at": 4.0, "ok": False, "error": "x"}
    newer = _rec(3, 5.0).to_json()
    newer_rev = {"op": "reverted", "id": newer["id"], "at": 6.0, "ok": True, "error": None}
    data = _data(old, old_rev, pending, failed_rev, newer, newer_rev)
    size = sum(len(k) + len(v) for k, v in data.items())
    assert prunable(data, limit=size) == []
    # Just over the limit: the oldest reverted fault goes, with its revert line, and nothing else.
    assert prunable(data, limit=size - 1) == [entry_key(old), entry_key(old_rev)]
    # Nothing fits: every reverted fault goes; the pending one (a failed revert) always stays.
    assert set(prunable(data, limit=0)) == set(data) - {entry_key(pending), entry_key(failed_rev)}


def test_first_append_creates_the_configmap_then_patches_it(api_server: Any) -> None:
    led = Ledger(ConfigMapStore(connection(api_server.url, None, None), "gd", "led"))
    assert led.where == "configmap://gd/led"
    rec = _rec(1, 10.0)
    api_server.responses[("POST", PATH)] = (201, _cm(_data(rec.to_json())))
    led.record(rec)  # the PATCH gets 404 (no ConfigMap yet): create it with the entry
    patch, create = api_server.requests
    assert (patch["method"], patch["path"], patch["content_type"]) == ("PATCH", f"{PATH}/led", MERGE)
    assert patch["body"] == {"data": _data(rec.to_json())}
    assert (create["method"], create["path"]) == ("POST", PATH)
    assert create["body"]["metadata"]["name"] == "led" and create["body"]["data"] == _data(rec.to_json())
    api_server.requests.clear()
    api_server.responses[("PATCH", f"{PATH}/led")] = (200, _cm(_data(rec.to_json())))
    led.mark_reverted(rec.id)
    (again,) = api_server.requests
    assert again["method"] == "PATCH" and again["content_type"] == MERGE
    (value,) = again["body"]["data"].values()
    assert json.loads(value)["op"] == "reverted" and json.loads(value)["id"] == rec.id


def test_pending_and_revert_read_the_configmap(api_server: Any) -> None:
    a, b = _rec(1, 10.0), _rec(2, 11.0)
    rev_a = {"op": "reverted", "id": a.id, "at": 12.0, "ok": True, "error": None}
    api_server.responses[("GET", f"{PATH}/led")] = (200, _cm(_data(a.to_json(), b.to_json(), rev_a)))
    api_server.responses[("PATCH", f"{PATH}/led")] = (200, _cm({}))
    led = Ledger(ConfigMapStore(connection(api_server.url, None, None), "gd", "led"))
    assert [r.id for r in led.pending()] == [b.id]
    done: list[int] = []
    revert_pending(led, {"test.touch": lambda args: done.append(args["n"])})
    assert done == [2]
    (mark,) = [r for r in api_server.requests if r["method"] == "PATCH"]
    assert json.loads(next(iter(mark["body"]["data"].values())))["id"] == b.id


def test_no_configmap_is_an_empty_ledger(api_server: Any) -> None:
    led = Ledger(ConfigMapStore(connection(api_server.url, None, None), "gd", "led"))
    assert led.records() == [] and led.pending() == []


def test_a_full_configmap_is_pruned_in_a_second_patch(
    api_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpufleet.chaos.backends import kube_ledger

    old = _rec(1, 1.0).to_json()
    old_rev = {"op": "reverted", "id": old["id"], "at": 2.0, "ok": True, "error": None}
    new = _rec(2, 3.0)
    stored = _data(old, old_rev, new.to_json())
    room = len(entry_key(new.to_json())) + len(entry_value(new.to_json()))  # the new entry only
    monkeypatch.setattr(kube_ledger, "PRUNE_AT_BYTES", room)
    api_server.responses[("PATCH", f"{PATH}/led")] = (200, _cm(stored))
    Ledger(ConfigMapStore(connection(api_server.url, None, None), "gd", "led")).record(new)
    add, prune = api_server.requests
    assert add["body"] == {"data": _data(new.to_json())}
    assert prune["body"] == {"data": {entry_key(old): None, entry_key(old_rev): None}}
    assert prune["content_type"] == MERGE


def test_a_configmap_ledger_needs_the_kubernetes_backend(tmp_path: Path) -> None:
    with pytest.raises(InvalidActivity, match=r"needs the kubernetes backend \(this run's is sandbox\)"):
        engine.context({"gpufleet_backend": "sandbox", "gpufleet_ledger": "configmap://gd/led"})
    with pytest.raises(InvalidActivity, match="expected configmap://<namespace>/<name>"):
        engine.parse_settings({"gpufleet_ledger": "configmap://gd"})
    # The stack's game-day backend is the sandbox's: refused as soon as the backend is known.
    with pytest.raises(InvalidActivity, match="needs the kubernetes backend"):
        engine.context({"gpufleet_stack": "sandbox", "gpufleet_ledger": "configmap://gd/led"})
    with pytest.raises(InvalidActivity, match="needs the kubernetes backend"):
        engine.ledger_of({"gpufleet_stack": "sandbox", "gpufleet_ledger": "configmap://gd/led"})


def test_a_context_opens_its_configmap_ledger_once(api_server: Any) -> None:
    ctx = engine.context({"gpufleet_backend": "kubernetes", "gpufleet_k8s_host": api_server.url,
                          "gpufleet_ledger": "configmap://gd/led"})
    assert ctx.ledger is ctx.ledger
    store = ctx.ledger.store
    assert isinstance(store, ConfigMapStore) and store.api is store.api


def test_cli_names_a_malformed_configmap_ledger() -> None:
    from typer.testing import CliRunner

    from gpufleet.cli.main import app

    r = CliRunner().invoke(app, ["chaos", "ledger", "--ledger", "configmap://only-namespace"])
    assert r.exit_code == 2
    assert "--ledger configmap://only-namespace" in r.output and "<namespace>/<name>" in r.output
