"""The collective probe (gpufleet.fleet.inspect.collprobe, ADR 0083): nccl-tests' bus bandwidth,
the metric named after the backend, bad input refused, and a real 2-rank gloo run on this host."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.fleet.inspect.codes import PERF_METRIC_CODES
from gpufleet.fleet.inspect.collprobe import bus_bandwidth_gbs, choose_backend, main, metric_name


def test_bus_bandwidth_is_nccl_tests_all_reduce_factor() -> None:
    # 1 GB in 0.1 s is an algbw of 10 GB/s; all_reduce's busbw factor is 2 (n - 1) / n.
    assert bus_bandwidth_gbs(10**9, 0.1, 2) == pytest.approx(10.0)
    assert bus_bandwidth_gbs(10**9, 0.1, 8) == pytest.approx(17.5)
    assert bus_bandwidth_gbs(10**9, 0.1, 1) == pytest.approx(10.0)
    assert bus_bandwidth_gbs(10**9, 0.0, 8) == 0.0


def test_the_metric_names_the_backend_and_inspect_knows_each() -> None:
    names = {metric_name("nccl", False), metric_name("nccl", True), metric_name("gloo", False)}
    assert names == {"nccl_allreduce_busbw_gbs", "rccl_allreduce_busbw_gbs", "gloo_allreduce_busbw_gbs"}
    assert names <= set(PERF_METRIC_CODES)


def test_nccl_only_when_every_rank_has_a_gpu() -> None:
    assert choose_backend(True, 8, 8) == "nccl"
    assert choose_backend(True, 4, 8) == "gloo"  # fewer GPUs than ranks: one rank per GPU is not met
    assert choose_backend(False, 0, 2) == "gloo"


@pytest.mark.parametrize(("argv", "says"), [
    (["--ranks", "0"], "--ranks 0 must be at least 1"),
    (["--size-mib", "0"], "--size-mib 0.0 must be in (0, 65536]"),
    (["--iters", "0"], "--iters 0 >= 1"),
    (["--deadline", "-1"], "--deadline -1.0 must be positive"),
])
def test_bad_input_exits_2_naming_it(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert says in capsys.readouterr().err


def test_two_gloo_ranks_measure_and_write_where_the_kubelet_reads(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "termination-log"
    rc = main(["--ranks", "2", "--size-mib", "4", "--iters", "5", "--warmup", "1", "--deadline", "120",
               "--termination-log", str(log)])
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert rc == 0, out
    doc = json.loads(log.read_text())
    assert doc == json.loads(out)
    assert doc["backend"] == "gloo" and doc["ranks"] == 2 and doc["sizeBytes"] == 4 * 1024 * 1024
    assert doc["perf"]["gloo_allreduce_busbw_gbs"] > 0


def test_ranks_that_cannot_finish_in_time_fail_with_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--ranks", "2", "--size-mib", "4", "--deadline", "0.5"]) == 1
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc["perf"] == {} and "did not finish within 0.5 s" in doc["error"]
