"""argv of the Slurm backend (built by pure functions; no ssh target exists on these machines)."""

import shlex

import pytest
from chaoslib.exceptions import InvalidActivity

from gpufleet.catalog.injection import DcgmInject, LinkDown
from gpufleet.chaos.backends import slurm as S


def test_dcgmi_inject() -> None:
    assert S.dcgmi_inject_argv(2, 230, 79) == [
        "dcgmi",
        "test",
        "--inject",
        "--gpuid",
        "2",
        "-f",
        "230",
        "-v",
        "79",
    ]
    assert S.dcgmi_inject_argv(0, 150, 95.5)[-1] == "95.5"


def test_ssh_quotes_the_remote_command() -> None:
    argv = S.ssh_argv(
        ("ssh", "-o", "BatchMode=yes"), "gpu-7", S.kmsg_argv("NVRM: Xid (PCI:0000:07:00): 79, x")
    )
    assert argv[:4] == ["ssh", "-o", "BatchMode=yes", "gpu-7"]
    assert argv[4] == "--"
    assert shlex.split(argv[5]) == ["sh", "-c", "echo 'NVRM: Xid (PCI:0000:07:00): 79, x' > /dev/kmsg"]


def test_ssh_rejects_option_like_hosts() -> None:
    with pytest.raises(InvalidActivity):
        S.ssh_argv(("ssh",), "-oProxyCommand=x", ["true"])


def test_kmsg_line_and_burst() -> None:
    line = S.kmsg_xid_line(45, "0000:3b:00")
    assert line == "NVRM: Xid (PCI:0000:3b:00): 45, pid=0, injected by gpufleet chaos"
    argv = S.kmsg_argv(line, 20)
    assert argv[:2] == ["sh", "-c"] and "-lt 20" in argv[2] and "> /dev/kmsg" in argv[2]
    with pytest.raises(InvalidActivity):
        S.kmsg_argv(line, 0)


def test_link_down_restores_itself() -> None:
    assert S.link_down_argv("ib0", 600) == [
        "setsid",
        "-f",
        "sh",
        "-c",
        "ip link set ib0 down; sleep 600; ip link set ib0 up",
    ]
    flap = S.link_flap_argv("ib1", 4, 3)[-1]
    assert "-lt 3" in flap and "sleep 2" in flap and flap.endswith("ip link set ib1 up")


def test_degrade_and_clear() -> None:
    assert S.tbf_argv("ib0", 50) == [
        "tc",
        "qdisc",
        "replace",
        "dev",
        "ib0",
        "root",
        "tbf",
        "rate",
        "50mbit",
        "burst",
        "200kbit",
        "latency",
        "400ms",
    ]
    assert S.tc_clear_argv("ib0") == ["tc", "qdisc", "del", "dev", "ib0", "root"]
    # nft 1.0.6 (Debian 12) rejects a one-line script without the ';' after the chain's '}'.
    assert S.nft_loss_argv("t", "ib0", 5)[1] == (
        "table inet t { chain input { type filter hook input priority -10; "
        'iifname "ib0" numgen random mod 1000 < 50 drop; }; }'
    )
    assert S.nft_delete_argv("t") == ["nft", "delete", "table", "inet", "t"]


def test_scontrol_and_slurmd() -> None:
    assert S.scontrol_resume_argv("gpu-1") == ["scontrol", "update", "nodename=gpu-1", "state=resume"]
    assert S.scontrol_drain_argv("gpu-1", "chaos") == [
        "scontrol",
        "update",
        "nodename=gpu-1",
        "state=drain",
        "reason=chaos",
    ]
    assert S.slurmd_signal_argv("SIGSTOP") == ["systemctl", "kill", "--signal=SIGSTOP", "slurmd"]


def test_plans_name_their_undo() -> None:
    b = S.SlurmBackend(("ssh",), "ib{rail}", None)
    plan = b.plan(LinkDown(rail=1), "gpu-3")
    assert plan.nodes_down == {"gpu-3"}
    assert plan.rollback.name == "slurm.ssh"
    assert plan.rollback.args["commands"] == [["ssh", "gpu-3", "--", "ip link set ib1 up"]]
    inj = b.plan(DcgmInject(field_id=230, value=79, kmsg=True), "gpu-3", 0)
    assert inj.rollback.args["commands"] == [
        ["ssh", "gpu-3", "--", "dcgmi test --inject --gpuid 0 -f 230 -v 0"]
    ]
