"""`gpufleet chaos validate`: what only the extension can check (configuration keys, fault ids, fault
classes, node selectors, GPU and rail indices, argument names and types), and the node selector
parser the engine shares."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpufleet.chaos.checks import check_experiment
from gpufleet.chaos.selectors import JobNode, NamedNode, parse_node_selector
from gpufleet.cli.main import app

ROOT = Path(__file__).parents[3]
EXPERIMENTS = sorted((ROOT / "experiments").glob("*.json"))
STACKS = ROOT / "stacks"


def base() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((ROOT / "experiments" / "gpu-xid79-fallen-off-bus.json").read_text())
    return doc


def inject_args(doc: dict[str, Any]) -> dict[str, Any]:
    act = next(a for a in doc["method"] if a["provider"].get("func") == "inject_gpu_fault")
    args: dict[str, Any] = act["provider"]["arguments"]
    return args


def problems(doc: dict[str, Any]) -> list[str]:
    return [str(p) for p in check_experiment(doc, STACKS)]


@pytest.mark.parametrize(
    ("text", "selector"),
    [("@job:0", JobNode(0)), ("@job:12", JobNode(12)), ("gpu-0", NamedNode("gpu-0")),
     ("node001.cluster.local", NamedNode("node001.cluster.local")), ("GPU_NODE7", NamedNode("GPU_NODE7"))],
)
def test_selectors_that_parse(text: str, selector: object) -> None:
    assert parse_node_selector(text) == selector


@pytest.mark.parametrize(
    "text", ["@job:", "@job:x", "@job:-1", "@job:1.5", "@jobs:0", "", "gpu 0", "-gpu", "gpu-"]
)
def test_selectors_that_do_not(text: str) -> None:
    with pytest.raises(ValueError, match="bad node"):
        parse_node_selector(text)


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_every_shipped_experiment_passes(path: Path) -> None:
    assert check_experiment(json.loads(path.read_text()), STACKS) == []


def test_every_problem_is_found_at_once_with_its_path() -> None:
    doc = base()
    doc["configuration"].update(gpufleet_colour="red", gpufleet_fault_class="gpu-broken",
                                gpufleet_backend="docker")
    inject_args(doc).update(fault_id="gpu-xid-999", node="@jobs:0", gpu="0", extra=1)
    got = problems(doc)
    at = "method[0].provider.arguments"
    assert got[0].startswith("configuration.gpufleet_colour: unknown key; known: gpufleet_allow_production")
    assert ("configuration: gpufleet_backend must be one of sandbox, slurm, kubernetes, storage "
            "(got 'docker')") in got
    assert any(g.startswith("configuration.gpufleet_fault_class: unknown fault class 'gpu-broken'")
               for g in got)
    assert f"{at}.extra: unknown argument of inject_gpu_fault; it takes: fault_id, node, gpu, " \
           "allow_spare_exhaustion" in got
    assert f"{at}.gpu: must be int (got '0')" in got
    assert any(g.startswith(f"{at}.node: bad node name '@jobs:0'") for g in got)
    assert f"{at}.fault_id: no fault 'gpu-xid-999' in the catalog (`gpufleet catalog list` lists them)" in got
    assert len(got) == 7, got


def test_gpu_index_rail_and_job_index_against_the_stack() -> None:
    doc = base()
    inject_args(doc).update(gpu=8, node="@job:2")  # sandbox: 8 GPUs per node, a 2-node job
    got = problems(doc)
    at = "method[0].provider.arguments"
    assert got == [
        f"{at}.node: @job:2: the stack's training job runs on 2 node(s) (@job:0 to @job:1)",
        f"{at}.gpu: GPU index 8 out of range: pool gpu has 8 GPUs per node (0 to 7)",
    ]
    inject_args(doc).update(gpu=7, node="gpu-9")
    assert problems(doc) == [f"{at}.node: no node 'gpu-9' in the stack; its nodes: gpu-0, gpu-1, gpu-2, "
                             "gpu-3, gpu-4"]
    inject_args(doc).update(node="gpu-4")  # the spare is a node too
    assert problems(doc) == []
    link = json.loads((ROOT / "experiments" / "fabric-link-down.json").read_text())
    act = next(a for a in link["method"] if a["provider"].get("func") == "link_down")
    act["provider"]["arguments"]["rail"] = 1
    assert any("rail 1 out of range: the stack has 1 rail(s) per node (0 to 0)" in p for p in problems(link))


def test_fault_needs_an_injection_for_the_backend(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    for src in (ROOT / "gpufleet" / "catalog" / "data").glob("*.yaml"):
        doc = yaml.safe_load(src.read_text())
        for fault in doc["faults"]:
            if fault["id"] == "gpu-xid-79":  # injected on the sandbox with a method it cannot plan
                fault["injectionOverrides"] = {"sandbox": {"method": "storage-slow", "rateMbit": 10}}
        (catalog / src.name).write_text(yaml.safe_dump(doc))
    doc = base()
    doc["configuration"]["gpufleet_catalog_dir"] = str(catalog)
    got = problems(doc)
    if any(g.startswith("configuration.gpufleet_catalog_dir") for g in got):
        pytest.skip(f"the catalog now requires a sandbox injection: {got}")
    assert len(got) == 1 and got[0].startswith(
        "method[0].provider.arguments.fault_id: fault gpu-xid-79: backend sandbox cannot inject "
        "storage-slow: the sandbox's checkpoint store is a local directory"), got
    assert ("(it can inject: dcgm-inject, exporter-inject, gpu-hang, host-signal, kill-rank, link-degrade"
            in got[0])


def test_a_fault_class_that_disagrees_with_the_fault_is_an_error() -> None:
    doc = base()
    doc["configuration"]["gpufleet_fault_class"] = "gpu-contained"
    assert problems(doc) == [
        "method[0].provider.arguments.fault_id: fault gpu-xid-79 is of class 'gpu-fatal' in the catalog, "
        "but configuration.gpufleet_fault_class says 'gpu-contained': drop the key (the class comes from "
        "the fault) or name the fault you mean"]


def test_unknown_stack_module_and_function() -> None:
    doc = base()
    doc["configuration"]["gpufleet_stack"] = "nope"
    doc["method"][0]["provider"]["func"] = "inject_gpu_faults"
    doc["rollbacks"][0]["provider"]["module"] = "gpufleet.chaos.gpu.rollbacks"
    got = problems(doc)
    assert any(g.startswith("configuration.gpufleet_stack: ") and "no such stack" in g for g in got)
    assert any(g.startswith("method[0].provider.func: gpufleet.chaos.gpu.actions has no activity "
                            "'inject_gpu_faults'") for g in got)
    assert any(g.startswith("rollbacks[0].provider.module: gpufleet.chaos.gpu.rollbacks is not an activity "
                            "module") for g in got)


def test_substitutions_and_other_extensions_are_left_to_run_time() -> None:
    doc = base()
    inject_args(doc).update(node="${target_node}", gpu="${gpu}")
    doc["configuration"]["gpufleet_stack"] = {"type": "env", "key": "STACK"}
    doc["method"].append({"type": "action", "name": "other", "provider": {
        "type": "python", "module": "chaosk8s.node.actions", "func": "drain_nodes", "arguments": {"x": 1}}})
    assert problems(doc) == []


def test_cli_reports_every_file_and_exits_2(tmp_path: Path) -> None:
    bad = copy.deepcopy(base())
    inject_args(bad)["gpu"] = 99
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    (tmp_path / "binary.json").write_bytes(b"\x00\x01")
    good = ROOT / "experiments" / "node-crash.json"
    result = CliRunner().invoke(app, ["chaos", "validate", str(good), str(tmp_path / "bad.json"),
                                      str(tmp_path / "binary.json"), str(tmp_path)])
    assert result.exit_code == 2
    assert f"valid {good}" in result.stdout
    err = " ".join(result.stderr.split())
    assert f"{tmp_path / 'bad.json'}: method[0].provider.arguments.gpu: GPU index 99 out of range" in err
    assert f"{tmp_path / 'binary.json'}: (file): is a binary file" in err
    assert f"{tmp_path}: (file): is a directory, not a file" in err
    assert "3 of 4 experiment(s) invalid" in err and "Traceback" not in result.output


def test_cli_all_shipped_experiments_valid() -> None:
    args = ["chaos", "validate", *map(str, EXPERIMENTS), "--stacks-dir", str(STACKS)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert result.stdout.count("valid ") == len(EXPERIMENTS)
