"""One conformance suite for every chaos backend (ADR 0030).

Every catalog fault's injection is planned on every backend that declares it among its
capabilities - the sandbox from a state file written here (plans are built, never applied: no
process, namespace or socket is touched), Slurm (argv only), Kubernetes against the local test API
server - and every plan is checked alike: it names its node, its rollback exists in ROLLBACKS with
JSON-serialisable arguments, and the nodes it takes down agree with the guard's `takes_node_down`.
A combination a backend does not declare, or declares without a planner, is an InvalidActivity
that says so.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from chaoslib.exceptions import ActivityFailed, InvalidActivity

from gpufleet.catalog import (
    INJECTION_MODELS,
    AnyInjection,
    Fault,
    InjectionModel,
    load_catalog,
    parse_injection,
)
from gpufleet.catalog.injection import DcgmInject, LinkDown, NodeHang, StorageSlow
from gpufleet.chaos import engine, sysops
from gpufleet.chaos.backends import sandbox as sandbox_backend
from gpufleet.chaos.backends.base import Backend, Plan
from gpufleet.chaos.backends.kubernetes import KubernetesBackend, connection
from gpufleet.chaos.backends.registry import BACKEND_CLASSES
from gpufleet.chaos.backends.sandbox import SandboxBackend
from gpufleet.chaos.backends.slurm import SlurmBackend
from gpufleet.chaos.backends.storage import StorageBackend
from gpufleet.chaos.guard import takes_node_down
from gpufleet.chaos.ledger import Ledger, Rollback
from gpufleet.chaos.rollbacks import ROLLBACKS
from gpufleet.chaos.settings import parse_settings
from gpufleet.core.sandbox_contract import (
    KWOK_NODE_ANNOTATION,
    KWOK_NODE_ANNOTATION_VALUE,
    FabricLink,
    Launch,
    SandboxNode,
    SandboxProcess,
    SandboxState,
    write_state,
)

CATALOG = load_catalog()
NODE = "gpu-0"
FAKE_PID, FAKE_START = 4242, 111
# The rank process the sandbox's kill-rank finds in the node's namespace (all faked below).
FAKE_ENV = {"SLURM_PROCID": "0"}
FAKE_CMD = ["python", "train.py"]


def _node(name: str, i: int, root: Path) -> SandboxNode:
    return SandboxNode(
        name=name, role="compute", netns=f"t1-{name}", mgmt_ifname="m0", mgmt_peer=f"p{i}",
        mgmt_address=f"10.0.0.{i + 2}/24", gpus=8, agent_socket=str(root / f"agent-{name}.sock"),
        leaf="leaf-0",
        fabric=[FabricLink(rail=r, ifname=f"fab{r}", peer=f"t1-f{i}{r}", address=f"10.1.{r}.{i}/24")
                for r in (0, 1)],
    )


def write_storage_state(root: Path) -> None:
    """A storage sandbox whose daemons are this test process (alive, never signalled: plans only)."""
    import os

    from gpufleet.core.procs import start_time
    from gpufleet.core.sandbox_contract import Launch, SandboxProcess
    from gpufleet.core.storage_contract import (
        JuiceFsRecord,
        OsdRecord,
        StorageSandboxState,
        write_storage_state,
    )

    me = SandboxProcess(name="x", pid=os.getpid(), start_time=start_time(os.getpid()) or 0,
                        launch=Launch(program=["true"], log=str(root / "log")))
    write_storage_state(StorageSandboxState(
        stack="sandbox", run_id="abcdef", phase="up", base_dir=str(root / "storage-run"), created_at=0,
        ceph_conf=str(root / "ceph.conf"), pool_size=2, pool_min_size=1, checkpoint_bucket="ckpt",
        backup_bucket="ckpt-backup",
        osds=[OsdRecord(id=i, uuid=f"u{i}", data_dir="d", block="b", block_bytes=1) for i in range(3)],
        processes=[me.model_copy(update={"name": n}) for n in ("ceph-osd.0", "ceph-osd.1", "ceph-osd.2",
                                                                  "radosgw", "redis", "juicefs-mount")],
        juicefs=JuiceFsRecord(name="jfs", meta_url="redis://127.0.0.1:1/1", meta_port=1, meta_db=1,
                              meta_dir=str(root / "redis"), scratch_port=2, bucket="jfs-data",
                              mountpoint=str(root / "mnt"), cache_dir=str(root / "cache"), cache_mib=64,
                              metrics="127.0.0.1:3", checkpoint_dir=str(root / "mnt" / "checkpoints")),
    ), root)


def write_sandbox_state(root: Path, **changes: Any) -> None:
    nodes = [_node("gpu-0", 0, root), _node("gpu-1", 1, root),
             SandboxNode(name="head", role="head", netns="t1-head", mgmt_ifname="m0", mgmt_peer="ph",
                         mgmt_address="10.0.0.1/24")]
    state = SandboxState(
        stack="sandbox", run_id="t1", phase="up", base_dir=str(root / "run"), created_at=0.0,
        head_netns="t1-head", slurm_conf=str(root / "slurm.conf"), nodes=nodes,
        processes=[SandboxProcess(name=f"slurmd@{n}", pid=FAKE_PID + 1, start_time=999, netns=f"t1-{n}",
                                  launch=Launch(program=["slurmd", "-D"], netns=f"t1-{n}", hostname=n,
                                                env={"SLURM_CONF": "x"}, log=str(root / f"{n}.log")),
                                  node=n)
                   for n in ("gpu-0", "gpu-1")],
        agent_token_file=None, checkpoint_dir=str(root / "ckpt"),
    )
    state.processes.append(_slurmctld_with_a_verified_backup(root, state))
    write_state(state.model_copy(update=changes), root)


def _slurmctld_with_a_verified_backup(root: Path, state: SandboxState) -> SandboxProcess:
    """slurm-state-loss plans only with a live slurmctld (this test process, never signalled: plans
    only), its StateSaveLocation in slurm.conf and a verified state backup young enough."""
    import os
    import time

    from gpufleet.core.procs import start_time
    from gpufleet.core.slurm_backup_checks import StateBackupEvidence, evidence_name
    from gpufleet.core.slurm_state_backups import backup_dir

    (root / "slurm.conf").write_text(f"StateSaveLocation={root / 'run' / 'slurm' / 'ctld'}\n")
    folder = backup_dir(state)
    folder.mkdir(parents=True, exist_ok=True)
    e = StateBackupEvidence(archive="slurm-state-1.tar.gz", taken_at=time.time(), seconds=1, paused_seconds=0,
                            bytes=1, files=1, sha256="0" * 64, verified=True)
    (folder / evidence_name(e.archive)).write_text(e.model_dump_json())
    return SandboxProcess(name="slurmctld", pid=os.getpid(), start_time=start_time(os.getpid()) or 0,
                          netns="t1-head", launch=Launch(program=["slurmctld", "-D"], netns="t1-head",
                                                         log=str(root / "ctld.log")), node="head")


@pytest.fixture
def no_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planning reads the node namespaces' processes: answer from fakes, run nothing."""
    s = sysops
    monkeypatch.setattr(s, "run", _no_command)
    monkeypatch.setattr(s, "netns_pids", lambda ns: [FAKE_PID] if ns.startswith("t1-gpu") else [])
    monkeypatch.setattr(s, "snapshot", lambda pids: [(p, FAKE_START) for p in pids])
    monkeypatch.setattr(s, "environ", lambda pid: FAKE_ENV)
    monkeypatch.setattr(s, "cmdline", lambda pid: FAKE_CMD)
    monkeypatch.setattr(sandbox_backend, "start_time", lambda pid: FAKE_START if pid == FAKE_PID else None)
    monkeypatch.setattr(sandbox_backend, "netns_exists", lambda ns: True)


def _no_command(argv: Any, *args: Any, **kwargs: Any) -> str:
    raise AssertionError(f"planning ran a command: {argv}")


def k8s_node(name: str, simulated: bool = False) -> dict[str, Any]:
    """A Node as the API server returns it: a real one (a kubelet runs it) or kwok's."""
    annotations = {KWOK_NODE_ANNOTATION: KWOK_NODE_ANNOTATION_VALUE} if simulated else {}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "annotations": annotations},
            "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


@pytest.fixture
def backends(tmp_path: Path, no_host: None, api_server: Any) -> Iterator[dict[str, Backend]]:
    write_sandbox_state(tmp_path)
    write_storage_state(tmp_path)
    api_server.responses[("GET", f"/api/v1/nodes/{NODE}")] = (200, k8s_node(NODE))
    yield {
        "sandbox": SandboxBackend("sandbox", tmp_path),
        "slurm": SlurmBackend(("ssh",), "ib{rail}", None),
        "kubernetes": KubernetesBackend(connection(api_server.url, None, None), "chaos", "img:test",
                                        "ib{rail}", None),
        "storage": StorageBackend("sandbox", tmp_path, Ledger(tmp_path / "faults.jsonl")),
    }


def _cases() -> list[tuple[str, str]]:
    return [(f.id, name) for f in CATALOG if f.injection is not None for name in BACKEND_CLASSES]


def check_plan(plan: Plan, injection: InjectionModel, fault: Fault | None, node: str) -> None:
    """What every plan of every backend must satisfy."""
    assert plan.kind == injection.method
    if injection.needs_node:
        assert plan.target.get("node") == node, plan.target
    assert plan.rollback.name in ROLLBACKS, f"rollback {plan.rollback.name} is not in ROLLBACKS"
    json.dumps(plan.rollback.args)  # `gpufleet chaos revert` replays it from the ledger alone
    json.dumps(plan.params)
    json.dumps(plan.target)
    cls = fault.fault_class.value if fault else None
    if injection.needs_node and takes_node_down(plan.kind, None):
        assert node in plan.nodes_down, f"{plan.kind} takes {node} down but the plan does not say so"
    if plan.nodes_down and fault is not None:
        # A plan may take its node down for its own reason (a host-signal with effect crash); for a
        # catalog fault the guard's rule must agree, or the ledger would not count the node as down.
        assert takes_node_down(plan.kind, cls), (
            f"the plan takes {plan.nodes_down} down but the guard thinks {plan.kind}/{cls} does not")


@pytest.mark.parametrize(("fault_id", "backend"), _cases())
def test_every_catalog_fault_on_every_backend(
    fault_id: str, backend: str, backends: dict[str, Backend]
) -> None:
    fault = CATALOG.get(fault_id)
    injection = fault.injection_for(backend)
    assert injection is not None
    b = backends[backend]
    if not b.can_inject(injection):
        with pytest.raises(InvalidActivity, match=f"backend {backend} cannot inject {injection.method}"):
            b.plan(injection, NODE, 0)
        return
    check_plan(b.plan(injection, NODE, 0), injection, fault, NODE)


def _minimal(model: type[InjectionModel]) -> AnyInjection:
    method = str(model.model_fields["method"].default)
    params: dict[str, dict[str, Any]] = {
        "dcgm-inject": {"fieldId": 230, "value": 79, "kmsg": True, "burst": 2},
        "exporter-inject": {"metric": "gpu_health", "value": 0},
        "link-down": {"rail": 1}, "link-flap": {"rail": 1, "periodSeconds": 2, "count": 3},
        "link-degrade": {"rail": 1, "lossPercent": 5, "rateMbit": 50}, "storage-slow": {"rateMbit": 10},
        "kill-rank": {"rank": 0}, "host-signal": {"signal": "cpu-state", "value": 2, "effect": "crash"},
        "switch-down": {"rail": 1}, "nic-remove": {"rail": 1}, "node-reboot": {"downSeconds": 1},
        "osd-kill": {"osd": 1}, "osd-hang": {"osd": 1}, "osd-near-full": {"full": True},
    }
    return parse_injection({"method": method, **params.get(method, {})})


@pytest.mark.parametrize("model", INJECTION_MODELS, ids=[str(m.model_fields["method"].default)
                                                         for m in INJECTION_MODELS])
@pytest.mark.parametrize("backend", list(BACKEND_CLASSES))
def test_every_declared_capability_plans(model: type[InjectionModel], backend: str,
                                         backends: dict[str, Backend]) -> None:
    """Also the capabilities no catalog fault uses yet (rail 1, every optional parameter)."""
    b = backends[backend]
    injection = _minimal(model)
    if model not in b.capabilities:
        with pytest.raises(InvalidActivity, match=r"cannot inject .*\(it can inject: "):
            b.plan(injection, NODE, 1)
        return
    check_plan(b.plan(injection, NODE, 1), injection, None, NODE)


def test_every_backend_declares_and_explains() -> None:
    for name, cls in BACKEND_CLASSES.items():
        assert cls.name == name
        assert cls.capabilities <= set(INJECTION_MODELS)
        assert not set(cls.not_offered) & cls.capabilities, f"{name}: a declared method is 'not offered'"
    assert StorageSlow in SandboxBackend.not_offered  # said, not silently missing


def test_a_declared_capability_without_a_planner_is_an_invalid_activity() -> None:
    class Half(Backend):
        name = "half"
        capabilities: ClassVar[frozenset[type[InjectionModel]]] = frozenset({LinkDown})

    with pytest.raises(InvalidActivity, match="backend half declares link-down but has no planner"):
        Half().plan(LinkDown(rail=0), NODE)


def test_a_parameter_a_backend_cannot_honour_is_an_invalid_activity(backends: dict[str, Backend]) -> None:
    with pytest.raises(InvalidActivity, match="reboot_on_restore needs out-of-band power control"):
        backends["slurm"].plan(NodeHang(reboot_on_restore=True), NODE)


def test_a_node_injection_without_a_node_is_refused(backends: dict[str, Backend]) -> None:
    with pytest.raises(InvalidActivity, match="link-down needs a node"):
        backends["slurm"].plan(LinkDown(rail=0))


# ----------------------------------------------------------------------------- error branches


class _Failing(Backend):
    name = "sandbox"

    def node_states(self) -> dict[str, Any]:
        return {}


def _ctx(tmp_path: Path) -> engine.Context:
    settings = parse_settings({"gpufleet_ledger": str(tmp_path / "faults.jsonl")})
    return engine.Context(settings, None, "sandbox", engine.RunState(experiment="t"))


@pytest.mark.parametrize(("error", "raised"), [
    (OSError("disk on fire"), ActivityFailed), (InvalidActivity("bad"), InvalidActivity),
    (ActivityFailed("failed"), ActivityFailed),
])
def test_a_failed_apply_is_undone_by_the_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 error: Exception, raised: type[Exception]) -> None:
    undone: list[dict[str, Any]] = []
    monkeypatch.setitem(ROLLBACKS, "test.record", undone.append)

    def apply() -> dict[str, Any]:
        raise error

    plan = Plan("link-down", {"node": NODE}, {}, Rollback("test.record", {"node": NODE}), apply, "test")
    ctx = _ctx(tmp_path)
    with pytest.raises(raised) as info:
        engine.execute(ctx, _Failing(), plan, "fabric-port-down")
    if raised is ActivityFailed and isinstance(error, OSError):
        assert "applying link-down failed: disk on fire" in str(info.value)
    assert undone == [{"node": NODE}]  # partly applied faults are undone at once
    led = Ledger(tmp_path / "faults.jsonl")
    assert len(led.records()) == 1 and led.pending() == []


def test_a_failed_apply_whose_undo_fails_stays_pending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(args: dict[str, Any]) -> None:
        raise OSError("undo failed too")

    monkeypatch.setitem(ROLLBACKS, "test.broken", broken)

    def apply() -> dict[str, Any]:
        raise OSError("apply failed")

    plan = Plan("link-down", {"node": NODE}, {}, Rollback("test.broken", {}), apply, "test")
    with pytest.raises(ActivityFailed, match="apply failed"):
        engine.execute(_ctx(tmp_path), _Failing(), plan, None)
    assert len(Ledger(tmp_path / "faults.jsonl").pending()) == 1  # `gpufleet chaos revert` retries it


def test_sandbox_missing_agent_socket(tmp_path: Path, no_host: None) -> None:
    nodes = [_node("gpu-0", 0, tmp_path).model_copy(update={"agent_socket": None})]
    write_sandbox_state(tmp_path, nodes=nodes)
    b = SandboxBackend("sandbox", tmp_path)
    inj = DcgmInject(field_id=230, value=79)
    with pytest.raises(ActivityFailed, match="node gpu-0 has no agent socket"):
        b.plan(inj, NODE, 0)
    with pytest.raises(ActivityFailed, match="node gpu-0 has no agent socket"):
        b.plan(parse_injection({"method": "host-signal", "signal": "psu-state", "value": 2}), NODE)


def test_sandbox_clear_with_the_agent_socket_gone_is_a_no_op(
    tmp_path: Path, no_host: None, caplog: pytest.LogCaptureFixture
) -> None:
    write_sandbox_state(tmp_path)
    plan = SandboxBackend("sandbox", tmp_path).plan(DcgmInject(field_id=230, value=79), NODE, 0)
    ROLLBACKS[plan.rollback.name](plan.rollback.args)  # socket gone (sandbox down): warns, no raise
    assert "agent-gpu-0.sock is gone" in caplog.text


@pytest.mark.parametrize(("injection", "gpu", "message"), [
    (LinkDown(rail=5), 0, r"node gpu-0 has no fabric rail 5 \(rails: \[0, 1\]\)"),
    (parse_injection({"method": "link-flap", "rail": 2, "periodSeconds": 2, "count": 1}), 0,
     "no fabric rail 2"),
    (parse_injection({"method": "nic-remove", "rail": 3}), 0, "no fabric rail 3"),
    (DcgmInject(field_id=230, value=79), 8, r"node gpu-0 has GPUs 0\.\.7, not 8"),
    (DcgmInject(field_id=230, value=79), -1, "not -1"),
])
def test_sandbox_bad_rail_or_gpu(tmp_path: Path, no_host: None, injection: AnyInjection, gpu: int,
                                 message: str) -> None:
    write_sandbox_state(tmp_path)
    with pytest.raises(InvalidActivity, match=message):
        SandboxBackend("sandbox", tmp_path).plan(injection, NODE, gpu)


def test_sandbox_unknown_or_head_node(tmp_path: Path, no_host: None) -> None:
    write_sandbox_state(tmp_path)
    b = SandboxBackend("sandbox", tmp_path)
    with pytest.raises(InvalidActivity, match="gpu-9"):
        b.plan(LinkDown(rail=0), "gpu-9")
    with pytest.raises(InvalidActivity, match="head is the head node"):
        b.plan(LinkDown(rail=0), "head")


def test_sandbox_not_up_or_missing(tmp_path: Path) -> None:
    with pytest.raises(ActivityFailed, match=r"no sandbox state at .*gpufleet sandbox up --stack sandbox"):
        SandboxBackend("sandbox", tmp_path)
    write_sandbox_state(tmp_path, phase="failed")
    with pytest.raises(ActivityFailed, match="sandbox sandbox is failed, not up"):
        SandboxBackend("sandbox", tmp_path)


def test_sandbox_kill_rank_without_the_rank(
    tmp_path: Path, no_host: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_sandbox_state(tmp_path)
    monkeypatch.setattr(sysops, "environ", lambda pid: {"SLURM_PROCID": "1"})
    with pytest.raises(ActivityFailed, match="no training process with SLURM_PROCID/RANK=0"):
        SandboxBackend("sandbox", tmp_path).plan(parse_injection({"method": "kill-rank", "rank": 0}))


def test_catalog_fault_the_backend_cannot_inject_is_refused_before_connecting(tmp_path: Path) -> None:
    # No sandbox state exists: the refusal comes from the declared capabilities, not a failed plan.
    cfg = {"gpufleet_backend": "sandbox", "gpufleet_stack": "sandbox", "gpufleet_sandbox_root": str(tmp_path),
           "gpufleet_stacks_dir": str(Path(__file__).parents[3] / "stacks"),
           "gpufleet_ledger": str(tmp_path / "faults.jsonl")}
    with pytest.raises(InvalidActivity, match="backend sandbox cannot inject storage-slow: the sandbox's"):
        engine.inject_catalog_fault(cfg, "storage-checkpoint-slow", None)
    with pytest.raises(InvalidActivity, match="gpufleet_fault_class is 'node-crash' but fault gpu-xid-79"):
        engine.inject_catalog_fault({**cfg, "gpufleet_fault_class": "node-crash"}, "gpu-xid-79", "gpu-0")
    with pytest.raises(InvalidActivity, match=r"overrides .*count"):
        engine.inject_catalog_fault(cfg, "fabric-link-flap", "gpu-0", count=0)
    assert Ledger(tmp_path / "faults.jsonl").records() == []


# ----------------------------------------------------------------------------- Kubernetes link-down


def test_kubernetes_link_down_and_clean_up(api_server: Any, tmp_path: Path) -> None:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-0001", "labels": {}},
            "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    other = {**node, "metadata": {"name": "gpu-0002", "labels": {}}}
    api_server.responses[("GET", "/api/v1/nodes")] = (200, {"apiVersion": "v1", "kind": "NodeList",
                                                            "items": [node, other]})
    api_server.responses[("GET", "/api/v1/nodes/gpu-0001")] = (200, node)
    pods = "/api/v1/namespaces/gpufleet-gameday/pods"
    api_server.responses[("POST", pods)] = (201, {"kind": "Pod"})
    cfg = {"gpufleet_backend": "kubernetes", "gpufleet_stack": "h200-ib", "gpufleet_k8s_host": api_server.url,
           "gpufleet_k8s_image": "ghcr.io/gpufleet/gpufleet:test", "gpufleet_allow_production": True,
           "gpufleet_ledger": str(tmp_path / "faults.jsonl")}
    from gpufleet.chaos.fabric import actions as fabric_actions

    out = fabric_actions.link_down("gpu-0001", rail=1, configuration=cfg)
    created = [r for r in api_server.requests if r["method"] == "POST"]
    assert [r["path"] for r in created] == [pods]
    body = created[0]["body"]
    name = body["metadata"]["name"]
    assert body["spec"]["nodeName"] == "gpu-0001" and body["spec"]["hostNetwork"] is True
    assert body["spec"]["containers"][0]["command"] == ["sh", "-c",
                                                        "ip link set ib1 down; sleep 600; ip link set ib1 up"]
    led = Ledger(tmp_path / "faults.jsonl")
    (rec,) = led.pending()
    assert rec.kind == "link-down" and rec.target == {"node": "gpu-0001", "rail": 1, "link": "ib1"}
    assert rec.params["takes_node_down"] is True and out["kind"] == "link-down"

    api_server.responses[("DELETE", f"{pods}/{name}")] = (200, {"kind": "Status"})
    api_server.responses[("DELETE", f"{pods}/{name}-undo")] = (404, {"kind": "Status", "code": 404})
    fabric_actions.restore_links(configuration=cfg)
    undo = [r for r in api_server.requests if r["method"] == "POST"][1]
    assert undo["body"]["metadata"]["name"] == f"{name}-undo"
    assert undo["body"]["spec"]["containers"][0]["command"] == ["ip", "link", "set", "ib1", "up"]
    deletes = [r["path"] for r in api_server.requests if r["method"] == "DELETE"]
    assert deletes == [f"{pods}/{name}", f"{pods}/{name}-undo"]  # a pod already gone (404) is fine
    assert led.pending() == []


def test_kubernetes_clean_up_error_keeps_the_entry_pending(api_server: Any, tmp_path: Path) -> None:
    from gpufleet.chaos.backends import kubernetes as k8s

    api_server.responses[("POST", "/api/v1/namespaces/ns/pods")] = (201, {"kind": "Pod"})
    api_server.responses[("DELETE", "/api/v1/namespaces/ns/pods/p")] = (403, {"kind": "Status"})
    with pytest.raises(ActivityFailed, match="delete pod p: 403"):
        k8s.rb_run_pod_and_cleanup({"conn": connection(api_server.url, None, None), "namespace": "ns",
                                    "undo_pod": None, "delete": ["p"]})
