"""The Kubernetes gate's pods (gpufleet.fleet.node_pod, ADR 0082 and 0083): where they run,
what they hold, how their end is judged, that they are bounded and removed whatever happens, and
the performance pod's figures."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gpufleet.config.model import GateSmokePod, InspectSpec, PerfPod, UpgradeGate
from gpufleet.fleet.node_pod import (
    NodePod,
    gpu_requests,
    node_pod_manifest,
    perf_figures,
    pod_name,
    pod_verdict,
    run_node_pod,
)

GP = NodePod(image="registry.example/train:1", command=["python", "-m", "train", "--steps", "1"],
             deadline_s=120, namespace="gpufleet-gameday", env={"B": "2", "A": "1"}, host_paths=["/opt/x"])


def node(capacity: dict[str, str], allocatable: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "gpu-3"},
            "status": {"capacity": capacity, "allocatable": capacity if allocatable is None else allocatable}}


def test_the_pod_runs_on_the_node_whatever_its_taints_holding_every_gpu() -> None:
    m = node_pod_manifest(node({"cpu": "96", "nvidia.com/gpu": "8", "amd.com/gpu": "0"}), GP, "r42")
    spec = m["spec"]
    assert spec["nodeName"] == "gpu-3"  # not the scheduler's: the node is cordoned
    assert spec["tolerations"] == [{"operator": "Exists"}]
    assert spec["restartPolicy"] == "Never" and spec["activeDeadlineSeconds"] == 120
    (c,) = spec["containers"]
    assert c["resources"] == {"requests": {"nvidia.com/gpu": "8"}, "limits": {"nvidia.com/gpu": "8"}}
    assert c["command"] == list(GP.command) and c["image"] == GP.image
    assert c["env"] == [{"name": "GPUFLEET_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                        {"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
    assert c["volumeMounts"] == [{"name": "host-0", "mountPath": "/opt/x", "readOnly": True}]
    assert spec["volumes"] == [{"name": "host-0", "hostPath": {"path": "/opt/x", "type": "Directory"}}]
    assert m["metadata"]["namespace"] == "gpufleet-gameday"
    assert m["metadata"]["name"] == "gpufleet-gate-gpu-3-r42"


def test_the_pod_asks_for_the_capacity_so_an_unhealthy_gpu_fails_admission() -> None:
    # A device plugin's Unhealthy GPU stays in the capacity and leaves the allocatable (the kubelet's
    # device manager): the pod must ask for all 8, which the kubelet cannot admit with 7.
    sick = node({"nvidia.com/gpu": "8"}, {"nvidia.com/gpu": "7"})
    assert gpu_requests(sick) == {"nvidia.com/gpu": "8"}
    c = node_pod_manifest(sick, GP, "r")["spec"]["containers"][0]
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "8"}


def test_a_node_without_gpus_gets_no_request_and_long_names_are_cut() -> None:
    assert gpu_requests(node({"cpu": "2", "memory": "24Gi"})) == {}
    assert "resources" not in node_pod_manifest(node({"cpu": "2"}), GP, "r")["spec"]["containers"][0]
    assert gpu_requests(node({"huawei.com/Ascend910": "8"})) == {"huawei.com/Ascend910": "8"}
    long = pod_name("n" * 60, "rollout")
    assert len(long) <= 63 and not long.endswith("-")


def status(phase: str, **kw: Any) -> dict[str, Any]:
    return {"status": {"phase": phase, **kw}}


def terminated(code: int, reason: str, message: str = "") -> list[dict[str, Any]]:
    return [{"state": {"terminated": {"exitCode": code, "reason": reason, "message": message}}}]


@pytest.mark.parametrize(("pod", "done", "passed", "says"), [
    (status("Succeeded", containerStatuses=terminated(0, "Completed", '{"passed": true}')), True, True,
     'smoke pod exit 0: {"passed": true}'),
    (status("Failed", containerStatuses=terminated(1, "Error", "rank 0 exited 1")), True, False,
     "smoke pod exit 1 (Error): rank 0 exited 1"),
    (status("Failed", reason="DeadlineExceeded", message="Pod was active on the node longer than the "
            "specified deadline"), True, False, "smoke pod DeadlineExceeded: Pod was active"),
    (status("Failed", reason="OutOfnvidia.com/gpu", message="Node didn't have enough resource"), True, False,
     "smoke pod OutOfnvidia.com/gpu"),
    (status("Pending", containerStatuses=[{"state": {"waiting": {"reason": "ErrImageNeverPull",
                                                                  "message": "not present"}}}]),
     True, False, "cannot start: ErrImageNeverPull: not present"),
    (status("Pending", containerStatuses=[{"state": {"waiting": {"reason": "ContainerCreating"}}}]),
     False, False, "phase Pending"),
    (status("Running"), False, False, "phase Running"),
    (status("Running", conditions=[{"type": "DisruptionTarget", "status": "True",
                                    "reason": "PreemptionByScheduler",
                                    "message": "default-scheduler: preempting to accommodate a pod"}]),
     True, False, "smoke pod disrupted (PreemptionByScheduler): default-scheduler: preempting"),
    (status("Running", conditions=[{"type": "DisruptionTarget", "status": "False"}]), False, False,
     "phase Running"),
])
def test_the_verdict_is_the_pods_end(pod: dict[str, Any], done: bool, passed: bool, says: str) -> None:
    v = pod_verdict(pod)
    assert (v.done, v.passed) == (done, passed)
    assert says in v.detail


class FakeCluster:
    """The API calls run_node_pod makes, on a clock that advances by each sleep."""

    def __init__(self, phases: list[str], leftover: bool = False) -> None:
        self.phases = phases
        self.now = 0.0
        self.calls: list[str] = []
        self.pod: dict[str, Any] | None = {"status": {"phase": "Running"}} if leftover else None

    def create(self, m: dict[str, Any]) -> None:
        self.calls.append("create")
        self.pod = {"status": {"phase": "Pending"}}

    def read(self, _name: str) -> dict[str, Any] | None:
        if self.pod is not None and self.calls and self.calls[-1] != "delete" and self.phases:
            self.pod = {"status": {"phase": self.phases.pop(0),
                                   "containerStatuses": terminated(0, "Completed", "ok")}}
        return self.pod

    def delete(self, _name: str) -> None:
        self.calls.append("delete")
        self.pod = None

    def run(self, wait_s: float, role: str = "smoke") -> tuple[bool, str]:
        run = run_node_pod(self.create, self.read, self.delete,
                           {"metadata": {"name": "p", "labels": {"gpufleet.io/gate-pod": role}}}, wait_s,
                           poll_s=1.0, clock=lambda: self.now, sleep=self._sleep)
        self.message = run.message
        return run.passed, run.detail

    def _sleep(self, s: float) -> None:
        self.now += s


def test_a_passing_pod_is_created_after_any_leftover_and_removed_after() -> None:
    c = FakeCluster(["Pending", "Running", "Succeeded"], leftover=True)
    passed, detail = c.run(30)
    assert passed and detail.startswith("smoke pod exit 0: ok in ")
    assert c.calls == ["delete", "create", "delete"] and c.pod is None


def test_a_pod_that_never_ends_fails_at_the_wait_and_is_removed() -> None:
    c = FakeCluster(["Running"] * 1000)
    passed, detail = c.run(10)
    assert not passed and detail == "smoke pod did not finish within 10 s (phase Running)"
    assert c.calls[-1] == "delete" and c.now <= 11


def test_the_stacks_smoke_pod_is_validated() -> None:
    gate = UpgradeGate.model_validate({"smokePod": {"image": "train:1", "command": ["run"]}})
    assert gate.smoke_pod == GateSmokePod(image="train:1", command=["run"], deadline_seconds=300.0)
    for bad in ({"image": "", "command": ["run"]}, {"image": "x", "command": []},
                {"image": "x", "command": ["run"], "deadlineSeconds": 0}):
        with pytest.raises(ValidationError):
            UpgradeGate.model_validate({"smokePod": bad})


def test_the_stacks_smoke_pod_becomes_the_gates_only_with_smoke_run_on() -> None:
    from pathlib import Path

    from gpufleet.cli.node_pods import smoke_pod as gate_smoke_pod
    from gpufleet.config import StackSpec, load_named_stack

    spec = load_named_stack("sandbox", Path("stacks"))
    assert gate_smoke_pod(spec) is None  # the sandbox stack sets no smokePod
    smoke = GateSmokePod(image="train:1", command=["run", "--steps", "1"], deadline_seconds=90)
    def with_gate(gate: UpgradeGate) -> StackSpec:
        return spec.model_copy(update={"upgrade": spec.upgrade.model_copy(update={"gate": gate})})

    gate = spec.upgrade.gate.model_copy(update={"smoke_pod": smoke})
    gp = gate_smoke_pod(with_gate(gate))
    assert gp == NodePod(image="train:1", command=("run", "--steps", "1"), deadline_s=90,
                         namespace=spec.gameday.namespace)
    assert gate_smoke_pod(with_gate(gate.model_copy(update={"smoke_run": False}))) is None


def test_a_perf_pod_is_named_for_its_role_and_its_whole_message_comes_back() -> None:
    perf = NodePod(image="nccl-tests:2", command=["probe"], deadline_s=60, namespace="ns", role="perf")
    m = node_pod_manifest(node({"nvidia.com/gpu": "8"}), perf, "r42")
    assert m["metadata"]["name"] == "gpufleet-perf-gpu-3-r42"
    assert m["metadata"]["labels"]["gpufleet.io/gate-pod"] == "perf"
    assert m["spec"]["containers"][0]["name"] == "perf"
    assert m["metadata"]["name"] != node_pod_manifest(node({}), GP, "r42")["metadata"]["name"]
    long_message = '{"perf": {"nccl_allreduce_busbw_gbs": 455.5}, "pad": "' + "x" * 1000 + '"}'
    v = pod_verdict(status("Succeeded", containerStatuses=terminated(0, "Completed", long_message)), "perf")
    assert v.passed and v.detail.startswith("perf pod exit 0: ...") and len(v.detail) < 450
    assert v.message == long_message  # the figures are read from the whole message, not the detail
    c = FakeCluster(["Succeeded"])
    passed, detail = c.run(30, role="perf")
    assert passed and detail.startswith("perf pod exit 0: ok in ") and c.message == "ok"


@pytest.mark.parametrize(("message", "figures", "why"), [
    ('{"perf": {"nccl_allreduce_busbw_gbs": 455.5, "h2d_gbs": 53}}', {"nccl_allreduce_busbw_gbs": 455.5,
                                                                      "h2d_gbs": 53.0}, None),
    ('# Avg bus bandwidth : 455.5\n{"perf": {"gloo_allreduce_busbw_gbs": 1.8}, "ranks": 2}',
     {"gloo_allreduce_busbw_gbs": 1.8}, None),
    ('{"perf": {"busbw": 455.5}}', {}, "perf.busbw: not a metric inspect knows"),
    ('{"perf": {"h2d_gbs": -1}}', {}, "perf.h2d_gbs: -1 is not a positive number"),
    ('{"perf": {"h2d_gbs": true}}', {}, "perf.h2d_gbs: True is not a positive number"),
    ('{"perf": {}, "error": "rank 1 exited 1"}', {}, "names no figure (rank 1 exited 1)"),
    ("# Avg bus bandwidth : 455.5", {}, 'no line {"perf": {...}}'),
    ("", {}, 'no line {"perf": {...}}'),
])
def test_perf_figures_are_read_and_checked(message: str, figures: dict[str, float], why: str | None) -> None:
    got, problem = perf_figures(message)
    assert got == figures
    assert (problem is None) if why is None else (problem is not None and why in problem)


def test_the_stacks_perf_pod_is_validated_and_becomes_the_node_pod() -> None:
    from pathlib import Path

    from gpufleet.cli.node_pods import SANDBOX_REFERENCE_RUNS, perf_pod, reference_nodes, reference_runs
    from gpufleet.config import load_named_stack

    spec_ = InspectSpec.model_validate({"perfPod": {"image": "nccl:1", "command": ["probe"],
                                                    "priorityClassName": "gpufleet-probe"}})
    assert spec_.perf_pod == PerfPod(image="nccl:1", command=["probe"], deadline_seconds=600.0,
                                     reference_nodes=3, reference_runs=1,
                                     priority_class_name="gpufleet-probe")
    for bad in ({"image": "x", "command": ["p"], "referenceNodes": 0},
                {"image": "x", "command": ["p"], "referenceRuns": 0},
                {"image": "x", "command": ["p"], "referenceRuns": 11},
                {"image": "x", "command": ["p"], "deadlineSeconds": -1}, {"image": "x", "command": []},
                {"image": "x", "command": ["p"], "priorityClassName": "Not_A_Name"}):
        with pytest.raises(ValidationError):
            InspectSpec.model_validate({"perfPod": bad})
    spec = load_named_stack("sandbox", Path("stacks"))
    assert perf_pod(spec) is None and reference_nodes(spec) == 1
    assert reference_runs(spec) == SANDBOX_REFERENCE_RUNS == 3  # the sandbox's probe on a shared CPU
    spec = spec.model_copy(update={"inspect": spec_})
    assert perf_pod(spec, app="a") == NodePod(image="nccl:1", command=("probe",), deadline_s=600.0,
                                              namespace=spec.gameday.namespace, role="perf", app="a",
                                              priority_class="gpufleet-probe")
    assert (reference_nodes(spec), reference_runs(spec)) == (3, 1)
    m = node_pod_manifest(node({}), perf_pod(spec) or GP, "r")
    assert m["spec"]["priorityClassName"] == "gpufleet-probe"
    assert "priorityClassName" not in node_pod_manifest(node({}), GP, "r")["spec"]


def test_a_bundle_pod_holds_no_gpu_sees_the_host_and_its_log_comes_back() -> None:
    from pathlib import Path

    from gpufleet.cli.node_pods import bundle_pod, sandbox_bundle_pod
    from gpufleet.config import load_named_stack
    from gpufleet.config.model import BundleSpec

    spec = load_named_stack("sandbox", Path("stacks"))
    assert bundle_pod(spec) is None
    command = ["python", "-m", "gpufleet.fleet.bundle.nodepod"]
    spec = spec.model_copy(update={"bundle": BundleSpec.model_validate(
        {"nodePod": {"image": "site/gpufleet-tools:3", "command": command}})})
    bp = bundle_pod(spec)
    assert bp is not None and (bp.deadline_s, bp.namespace) == (180.0, spec.gameday.namespace)
    for pod in (bp, sandbox_bundle_pod(spec)):
        m = node_pod_manifest(node({"nvidia.com/gpu": "8"}), pod, "r42")
        # It runs beside the job that holds the GPUs, on the node as the fault left it.
        (c,) = m["spec"]["containers"]
        assert "resources" not in c
        assert c["securityContext"] == {"privileged": True} and m["spec"]["hostPID"] is True
        assert m["metadata"]["name"] == "gpufleet-bundle-gpu-3-r42" and c["name"] == "bundle"
    assert "--vendor" in sandbox_bundle_pod(spec).command
    assert "hostPID" not in node_pod_manifest(node({}), GP, "r")["spec"]
    with pytest.raises(ValidationError):
        BundleSpec.model_validate({"nodePod": {"image": "x", "command": []}})

    logs: list[str] = []
    c = FakeCluster(["Succeeded"])
    run = run_node_pod(c.create, c.read, c.delete, {"metadata": {"name": "p", "labels": {}}}, 30, poll_s=1.0,
                       clock=lambda: c.now, sleep=c._sleep, read_log=lambda n: logs.append(n) or "the log")
    assert run.passed and run.log == "the log" and logs == ["p"]
    assert c.calls == ["delete", "create", "delete"]  # read before the removal
