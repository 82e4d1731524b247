"""Rendered Slurm and Prometheus configuration (gpufleet.sandbox.configs)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpufleet.config.load import load_named_stack, parse_stack
from gpufleet.config.model import StackSpec
from gpufleet.core.maintenance import held_by_rollout
from gpufleet.sandbox import configs
from gpufleet.sandbox.layout import Layout, plan_layout

REPO = Path(__file__).resolve().parents[3]
BIN = Path("/venv/bin/gpufleet")


@pytest.fixture(scope="module")
def spec() -> StackSpec:
    return load_named_stack("sandbox", REPO / "stacks")


@pytest.fixture(scope="module")
def layout(spec: StackSpec) -> Layout:
    return plan_layout("sandbox", spec, "abc123", Path("/run/gf/sandbox/run-abc123"))


def _keys(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and not line.startswith(("NodeName=", "PartitionName=")):
            k, _, v = line.partition("=")
            out[k] = v
    return out


def test_slurm_conf_carries_the_stack_timings(layout: Layout) -> None:
    k = _keys(configs.slurm_conf(layout, BIN))
    assert k["SlurmdTimeout"] == "10"
    assert k["MessageTimeout"] == "2"  # stacks/Pulumi.sandbox.yaml sandbox.slurm.messageTimeout
    assert k["AuthInfo"] == "socket=/run/gf/sandbox/run-abc123/munge/munge.socket,cred_expire=10"
    assert k["HealthCheckInterval"] == "5"
    assert k["HealthCheckProgram"] == "/run/gf/sandbox/run-abc123/slurm/healthcheck.sh"
    assert k["Epilog"] == "/run/gf/sandbox/run-abc123/slurm/epilog.sh"  # ADR 0051
    assert k["ReturnToService"] == "1"
    assert k["JobRequeue"] == "1"
    assert k["SchedulerParameters"] == "bf_interval=1,sched_interval=2"
    assert k["ProctrackType"] == "proctrack/linuxproc"
    assert k["TaskPlugin"] == "task/none"
    assert k["SlurmctldHost"] == "head(10.77.0.1)"
    assert k["GresTypes"] == "gpu"


def test_slurm_conf_changes_with_the_stack(spec: StackSpec) -> None:
    data = spec.model_dump(by_alias=True, mode="json", exclude_none=True)
    data["sandbox"]["slurm"] = {
        "slurmdTimeout": 5,
        "messageTimeout": 2,
        "credExpire": 5,
        "healthCheckInterval": 3,
    }
    lay = plan_layout("fast", parse_stack(data, "x"), "abc123", Path("/b"))
    k = _keys(configs.slurm_conf(lay, BIN))
    assert (k["SlurmdTimeout"], k["MessageTimeout"], k["HealthCheckInterval"]) == ("5", "2", "3")
    assert k["AuthInfo"].endswith("cred_expire=5")


def test_nodes_partition_and_spare_weight(layout: Layout) -> None:
    text = configs.slurm_conf(layout, BIN)
    nodes = re.findall(r"^NodeName=(\S+) NodeAddr=(\S+) .*Gres=gpu:8 Weight=(\d+)", text, re.M)
    assert nodes == [
        ("gpu-0", "10.77.0.10", "1"),
        ("gpu-1", "10.77.0.11", "1"),
        ("gpu-2", "10.77.0.12", "1"),
        ("gpu-3", "10.77.0.13", "1"),
        ("gpu-4", "10.77.0.14", "100"),
    ]
    assert "PartitionName=train Nodes=gpu-0,gpu-1,gpu-2,gpu-3,gpu-4 Default=YES" in text


def test_cgroup_conf_avoids_cgroup_mounts(layout: Layout) -> None:
    k = _keys(configs.cgroup_conf(layout))
    assert k == {"CgroupPlugin": "cgroup/v1", "CgroupAutomount": "no"}


def test_gres_conf_gives_every_node_its_device_files(layout: Layout) -> None:
    lines = [x for x in configs.gres_conf(layout).splitlines() if x.startswith("NodeName=")]
    assert lines[0] == "NodeName=gpu-0 Name=gpu File=/run/gf/sandbox/run-abc123/nodes/gpu-0/dev/nvidia[0-7]"
    assert len(lines) == 5


def test_health_script_maps_each_namespace_to_its_node(layout: Layout, tmp_path: Path) -> None:
    text = configs.health_script(layout, BIN)
    for n in layout.nodes:
        assert f"  {n.netns}) node={n.name} ;;" in text
    assert "export SLURM_CONF=/run/gf/sandbox/run-abc123/slurm/slurm.conf" in text
    assert '/venv/bin/python -m gpufleet.health --sandbox --node "$node"' in text
    assert "--token-file /run/gf/sandbox/run-abc123/agent.token --anchor-ifname mgmt0 --slurm-drain" in text
    assert "exec /venv/bin/python" in text and "--wait-lock" not in text  # the periodic check skips
    script = tmp_path / "hc.sh"
    script.write_text(text)
    assert subprocess.run(["sh", "-n", str(script)]).returncode == 0  # valid shell syntax
    # Outside every node namespace of the run it refuses, and says so.
    res = subprocess.run(["sh", str(script)], capture_output=True, text=True)
    assert res.returncode == 2 and "not inside a node namespace of sandbox run abc123" in res.stderr


def test_the_epilog_runs_the_same_check_and_never_fails_the_node(layout: Layout, tmp_path: Path) -> None:
    text = configs.health_script(layout, BIN, epilog=True)
    for n in layout.nodes:
        assert f"  {n.netns}) node={n.name} ;;" in text
    check = text[text.index("/venv/bin/python -m gpufleet.health"):]
    # The same check and drain as the periodic one, waiting for a running check instead of skipping,
    # its verdict kept in the node's epilog.log, and exit 0: a failing Epilog would drain the node
    # with Slurm's "Epilog error" instead of the fault's reason.
    assert '--sandbox --node "$node"' in check and "--slurm-drain" in check and "--wait-lock 10" in check
    assert '>>"/run/gf/sandbox/run-abc123/nodes/$node/epilog.log" 2>&1' in check
    assert check.rstrip().endswith("exit 0") and "exec " not in text
    script = tmp_path / "epilog.sh"
    script.write_text(text)
    assert subprocess.run(["sh", "-n", str(script)]).returncode == 0
    res = subprocess.run(["sh", str(script)], capture_output=True, text=True)
    assert res.returncode == 0 and "not inside a node namespace" in res.stderr


def test_prometheus_config_scrapes_every_agent_and_the_training_job(layout: Layout) -> None:
    rules = Path("/repo/monitoring/rules/gpufleet.rules.yaml")
    cfg = yaml.safe_load(configs.prometheus_yaml(layout, [rules]))
    assert cfg["global"]["scrape_interval"] == "2s"
    assert cfg["global"]["evaluation_interval"] == "1s"
    assert cfg["rule_files"] == [str(rules)]
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    targets = jobs["dcgm"]["static_configs"]
    assert [t["targets"] for t in targets] == [[f"10.77.0.{10 + i}:9400"] for i in range(5)]
    assert targets[3]["labels"] == {
        "node": "gpu-3", "Hostname": "gpu-3", "role": "compute", "leaf": "gpu-leaf-001"}
    assert jobs["training"]["file_sd_configs"][0]["files"] == [
        "/run/gf/sandbox/run-abc123/prometheus/file_sd/*.json"
    ]


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed"
)
def test_promtool_accepts_the_prometheus_config(layout: Layout, tmp_path: Path) -> None:
    rules = tmp_path / "r.yaml"
    rules.write_text("groups: [{name: t, rules: [{alert: A, expr: up == 0}]}]\n")
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(configs.prometheus_yaml(layout, [rules]))
    res = subprocess.run(
        ["promtool", "check", "config", "--syntax-only", str(cfg)], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_sub_second_durations_render_in_ms() -> None:
    assert configs.prom_duration(0.5) == "500ms"
    assert configs.prom_duration(2) == "2s"


def test_a_serving_pool_is_outside_slurm_and_behind_haproxy() -> None:
    from gpufleet.sandbox.serving.balancer import haproxy_config
    from gpufleet.sandbox.serving.start import balancer_config, replica_argv, urls

    spec = load_named_stack("sandbox-serving", REPO / "stacks")
    lay = plan_layout("sandbox-serving", spec, "abc123", Path("/run/gf/s/run-abc123"))
    assert [(n.name, n.role) for n in lay.serving_nodes] == [("srv-0", "serving"), ("srv-1", "serving")]
    # The training nodes keep their indices and addresses; the serving nodes come after them.
    assert [n.mgmt_ip for n in lay.slurm_nodes] == [f"10.76.0.{10 + i}" for i in range(5)]
    text = configs.slurm_conf(lay, BIN)
    assert "NodeName=srv-" not in text and "Nodes=gpu-0,gpu-1,gpu-2,gpu-3,gpu-4 " in text
    assert "srv-" not in configs.gres_conf(lay)
    assert "gf-abc123-srv-0) node=srv-0" in configs.health_script(lay, BIN)  # the agents' nodes all map
    assert spec.sandbox is not None and spec.sandbox.serving is not None
    serving = spec.sandbox.serving
    assert replica_argv(lay, "srv-1", serving, "/venv/bin/python") == [
        "/venv/bin/python", "-m", "gpufleet.sandbox.serving.replica", "--name", "srv-1",
        "--listen", "10.76.0.16:8080", "--health-file", "/run/gf/s/run-abc123/nodes/srv-1/gpu-health.json"]
    cfg = haproxy_config(balancer_config(lay, serving), "/p")
    assert "bind 10.76.0.1:8080" in cfg and "server srv-0 10.76.0.15:8080 check" in cfg
    assert urls(lay, serving) == ("http://10.76.0.1:8080", "http://10.76.0.1:8404/stats;csv")


@pytest.mark.parametrize(("reason", "stands_aside"), [
    ("gpufleet-upgrade r-1: driver -> 570.124.06", True),
    ("gpufleet-upgrade r-1: driver -> 570.124.06 : reboot issued", True),
    ("gpufleet-upgrade-failed: gate failed at 570.124.06", True),
    ("gpufleet: GPU has fallen off the bus (gpu-xid-79, GPU 3)", False),
    ("", False),
])
def test_the_epilog_stands_aside_in_shell_for_a_node_a_rollout_holds(
        layout: Layout, tmp_path: Path, reason: str, stands_aside: bool) -> None:
    # The Epilog's early exit (ADR 0063) must agree with held_by_rollout, the rule node-health reads.
    assert held_by_rollout(reason) is stands_aside
    text = configs.health_script(layout, BIN, epilog=True)
    start = text.index('reason=$(timeout 5 sinfo')
    block = text[start:text.index("esac", start) + len("esac")]
    block = block.replace("/run/gf/sandbox/run-abc123", str(tmp_path))
    (tmp_path / "nodes" / "gpu-1").mkdir(parents=True)
    script = tmp_path / "block.sh"
    # timeout and sinfo stand in as shell functions: sinfo prints the reason slurmctld would give (%E).
    stand_ins = "timeout() { shift; \"$@\"; }\nsinfo() { printf '%s\\n' \"$REASON\"; }\n"
    script.write_text(f"{stand_ins}node=gpu-1\n{block}\necho went-on\n")
    res = subprocess.run(["sh", str(script)], capture_output=True, text=True, env={"REASON": reason})
    assert res.returncode == 0
    log = tmp_path / "nodes" / "gpu-1" / "epilog.log"
    if stands_aside:
        assert "went-on" not in res.stdout and "epilog stood aside" in log.read_text()
    else:
        assert "went-on" in res.stdout and not log.exists()
