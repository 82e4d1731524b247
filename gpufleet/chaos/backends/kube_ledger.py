"""The fault ledger in a ConfigMap of the cluster the faults go into (`configmap://<ns>/<name>`).

Why: the game-day CronJob's pod has a read-only root filesystem and an emptyDir that dies with it,
so a file ledger there is lost exactly when it is needed (the pod killed, evicted or OOM-killed with
a node cordoned, a taint or a fault pod in place). The API server keeps the ledger instead: each
append is one JSON merge patch (RFC 7386) adding one key, acknowledged once etcd has it, and the
next game-day pod (or `gpufleet chaos revert --ledger configmap://...`) reads what is pending and
reverts it.

- One key per ledger object: `<at, zero-padded>-<id>-<op>`, so sorting the keys gives the order
  in which they were appended and two writers never touch the same key.
- A ConfigMap holds at most 1 MiB of data (Kubernetes docs, "ConfigMaps": "The data stored in a
  ConfigMap cannot exceed 1 MiB"). Past PRUNE_AT_BYTES, the oldest faults whose revert succeeded
  are dropped with their revert lines (nothing is left to undo for them; the game-day reports
  keep their history); a pending fault is never dropped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from chaoslib.exceptions import ActivityFailed

from gpufleet.chaos.backends.kubernetes import api_error, core_api
from gpufleet.core.ledger_location import configmap_ledger

MERGE = "application/merge-patch+json"
PRUNE_AT_BYTES = 768 * 1024  # well under the 1 MiB a ConfigMap may hold
LEDGER_LABEL = {"app.kubernetes.io/managed-by": "gpufleet", "gpufleet.io/fault-ledger": "true"}


def entry_key(obj: Mapping[str, Any]) -> str:
    """The data key of one ledger object: sorts in append order (time first), unique per object."""
    return f"{float(obj['at']):020.6f}-{obj['id']}-{obj['op']}"


def entry_value(obj: Mapping[str, Any]) -> str:
    return json.dumps(obj, sort_keys=True, default=str)


def objects_of(data: Mapping[str, str] | None) -> list[dict[str, Any]]:
    """The ledger objects a ConfigMap's data holds, in append order (an unreadable value skipped)."""
    out = []
    for key in sorted(data or {}):
        try:
            obj = json.loads((data or {})[key])
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def data_size(data: Mapping[str, str]) -> int:
    return sum(len(k.encode()) + len(v.encode()) for k, v in data.items())


def prunable(data: Mapping[str, str], limit: int = PRUNE_AT_BYTES) -> list[str]:
    """Keys to drop so the data fits under `limit`, oldest fault first: only faults whose revert
    succeeded and dry runs (nothing to undo), each with every line of it; a pending fault stays."""
    size = data_size(data)
    if size <= limit:
        return []
    by_id: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for key in sorted(data):
        try:
            obj = json.loads(data[key])
        except ValueError:
            obj = {}
        by_id.setdefault(str(obj.get("id", key)), []).append((key, obj))
    drop: list[str] = []
    for entries in by_id.values():  # dicts keep insertion order: the oldest first entry first
        ops = [o for _, o in entries]
        done = any(o.get("op") == "reverted" and o.get("ok") for o in ops)
        dry = any(o.get("op") == "apply" and o.get("dry_run") for o in ops)
        if not (done or dry):
            continue
        for key, _ in entries:
            drop.append(key)
            size -= len(key.encode()) + len(data[key].encode())
        if size <= limit:
            break
    return drop


class ConfigMapStore:
    """A LedgerStore in a ConfigMap, through the Kubernetes API (`conn` as the chaos backend's)."""

    def __init__(self, conn: dict[str, Any], namespace: str, name: str) -> None:
        self.conn, self.namespace, self.name = conn, namespace, name
        self._api: Any = None

    @property
    def api(self) -> Any:
        """One CoreV1Api for the store's life: a record and the pending read after it share it."""
        if self._api is None:
            self._api = core_api(self.conn)
        return self._api

    @property
    def where(self) -> str:
        return configmap_ledger(self.namespace, self.name)

    def _fail(self, what: str, e: Any) -> ActivityFailed:
        return api_error(f"fault ledger {self.where}: {what}", e)

    def append(self, obj: dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        api = self.api
        patch = {"data": {entry_key(obj): entry_value(obj)}}
        try:
            resp = api.patch_namespaced_config_map(self.name, self.namespace, patch, _content_type=MERGE,
                                                   _preload_content=False)
        except ApiException as e:
            if e.status != 404:
                raise self._fail("append", e) from None
            resp = self._create(api, patch["data"])
            if resp is None:  # another writer created it first: append to theirs
                try:
                    resp = api.patch_namespaced_config_map(self.name, self.namespace, patch,
                                                           _content_type=MERGE, _preload_content=False)
                except ApiException as e2:
                    raise self._fail("append", e2) from None
        data = json.loads(resp.data).get("data") or {}
        drop = prunable(data, PRUNE_AT_BYTES)
        if drop:
            try:
                api.patch_namespaced_config_map(self.name, self.namespace, {"data": dict.fromkeys(drop)},
                                                _content_type=MERGE, _preload_content=False)
            except ApiException as e:
                raise self._fail("prune", e) from None

    def _create(self, api: Any, data: dict[str, str]) -> Any:
        from kubernetes.client.exceptions import ApiException

        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": self.name, "namespace": self.namespace, "labels": LEDGER_LABEL},
                "data": data}
        try:
            return api.create_namespaced_config_map(self.namespace, body, _preload_content=False)
        except ApiException as e:
            if e.status == 409:
                return None
            raise self._fail("create", e) from None

    def objects(self) -> Iterator[dict[str, Any]]:
        from kubernetes.client.exceptions import ApiException

        api = self.api
        try:
            resp = api.read_namespaced_config_map(self.name, self.namespace, _preload_content=False)
        except ApiException as e:
            if e.status == 404:
                return iter(())  # nothing was ever recorded there
            raise self._fail("read", e) from None
        return iter(objects_of(json.loads(resp.data).get("data")))
