"""The doctor's advice (gpufleet.sandbox.doctor): exact packages and commands."""

from __future__ import annotations

from gpufleet.sandbox import doctor


def test_missing_binaries_map_to_debian_packages() -> None:
    present = {"ip", "tc", "unshare", "hostname", "nft"}
    missing = doctor.missing_packages(lambda b: f"/usr/bin/{b}" if b in present else None)
    assert set(missing) == {"slurmctld", "slurmd", "slurm-client", "munge", "prometheus", "haproxy"}
    assert sorted(missing["slurm-client"]) == ["sbatch", "scontrol", "sinfo", "srun"]
    checks = doctor.package_checks(missing)
    assert not any(c.ok for c in checks)
    assert checks[-1].fix.endswith(
        "apt-get install -y --no-install-recommends haproxy munge prometheus slurm-client slurmctld slurmd"
    )


def test_nothing_missing_is_one_ok_check() -> None:
    checks = doctor.package_checks(doctor.missing_packages(lambda b: "/bin/" + b))
    assert len(checks) == 1 and checks[0].ok


def test_not_root_says_how() -> None:
    c = doctor.root_check(1000)
    assert not c.ok and "uid 1000" in c.detail and "sudo" in c.fix
    assert doctor.root_check(0).ok


def test_kernel_advice_names_the_config_option() -> None:
    assert "CONFIG_NET_SCH_TBF" in doctor.kernel_fix("tbf")
    assert "CONFIG_VETH" in doctor.kernel_fix("veth")
