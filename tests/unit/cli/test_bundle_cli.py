"""`gpufleet bundle collect|show`: exit codes and messages, never a traceback; a real-node
collection on a machine without vendor tools records each of them as failed."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.fleet.bundle.archive import verify

runner = CliRunner()


def run(args: list[str]) -> Result:
    result = runner.invoke(app, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result


def _real(tmp_path: Path, *extra: str) -> Result:
    return run(["bundle", "collect", "--real", "--node", "n1", "--vendor", "ascend", "--fabric", "roce",
                "--scheduler", "slurm", "--ifnames", "lo", "--devices", "0", "--out", str(tmp_path),
                "--timeout", "5", "--deadline", "20", "--json", *extra])


def test_a_real_node_collection_records_every_missing_vendor_tool(tmp_path: Path) -> None:
    res = _real(tmp_path)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    members = {m["collector"]: m for m in doc["manifest"]["members"]}
    assert set(members) >= {"npu-smi-info", "npu-smi-health-0", "ethtool-stats-lo", "ip-link", "journalctl-k",
                            "dmesg", "slurmd-log", "scontrol-node"}
    # These machines have no Ascend NPU and no npu-smi: recorded as failed, with why.
    assert members["npu-smi-info"]["status"] == "failed"
    assert "npu-smi" in members["npu-smi-info"]["error"]
    assert members["ip-link"]["status"] == "ok" and members["ip-link"]["sha256"]
    path = Path(doc["path"])
    assert verify(path)[1] == []
    assert not list(Path("/tmp").glob(f"gpufleet-bundle-*/{path.name}"))


def test_show_exit_codes(tmp_path: Path) -> None:
    res = _real(tmp_path)
    path = Path(json.loads(res.stdout)["path"])
    ok = run(["bundle", "show", str(path)])
    assert ok.exit_code == 0 and "verified: every member matches its sha256" in ok.stdout
    shown = json.loads(run(["bundle", "show", str(path), "--json"]).stdout)
    assert shown["verified"] is True and shown["manifest"]["node"] == "n1"
    # Tamper with one member: exit 1, the member named.
    with tarfile.open(path) as tar:
        items = {i.name: tar.extractfile(i).read() for i in tar}  # type: ignore[union-attr]
    items["fabric/ip-link.txt"] = b"changed"
    with tarfile.open(path, "w:gz") as tar:
        for k, v in items.items():
            info = tarfile.TarInfo(k)
            info.size = len(v)
            tar.addfile(info, io.BytesIO(v))
    bad = run(["bundle", "show", str(path)])
    assert bad.exit_code == 1 and "MISMATCH fabric/ip-link.txt: sha256" in bad.stdout
    junk = tmp_path / "junk.tar.gz"
    junk.write_text("x")
    res = run(["bundle", "show", str(junk)])
    assert res.exit_code == 2 and "not a gzip-compressed tar archive" in " ".join(res.stderr.split())


@pytest.mark.parametrize(("args", "message"), [
    (["--since", "yesterday"], "--since 'yesterday': not a duration"),
    (["--total-mib", "1", "--collector-mib", "2"], "over the total cap"),
    (["--stack", "nosuch"], "no sandbox state file"),
    (["--real", "--vendor", "intel"], "vendor 'intel' is not one of"),
    (["--real", "--devices", "a"], "--devices 'a': 'a' is not an accelerator index"),
    (["--real", "--with", "nope"], "--with nope: no such collector"),
])
def test_bad_input_exits_2_with_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           args: list[str], message: str) -> None:
    monkeypatch.setenv("GPUFLEET_SANDBOX_ROOT", str(tmp_path / "root"))
    res = run(["bundle", "collect", "--node", "n1", "--out", str(tmp_path), *args])
    assert res.exit_code == 2, res.output
    assert message in " ".join(res.stderr.split())


def test_kubernetes_and_real_together_is_bad_input(tmp_path: Path) -> None:
    res = run(["bundle", "collect", "--real", "--kubernetes", "--node", "n1", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "--real and --kubernetes" in res.output
    assert list(tmp_path.iterdir()) == []


def test_kubernetes_without_a_reachable_cluster_is_bad_input(tmp_path: Path) -> None:
    missing = tmp_path / "no-such.kubeconfig"
    res = run(["bundle", "collect", "--kubernetes", "--node", "gpu-0", "--kubeconfig", str(missing),
               "--out", str(tmp_path / "out")])
    assert res.exit_code == 2 and "no Kubernetes cluster to reach" in res.output
    assert str(missing) in res.output.replace("\n", "")
    assert not (tmp_path / "out").exists()
