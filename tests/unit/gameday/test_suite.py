from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.chaos.workload.probes import BUDGET_TOLERANCE
from gpufleet.core.errors import InputError
from gpufleet.gameday import discover, parse_experiment, select
from gpufleet.gameday.contract import PROBES_MODULE
from gpufleet.slo import Outcome

FIXTURES = Path(__file__).parent / "fixtures" / "experiments"


def test_default_suite_is_tagged_and_ordered() -> None:
    suite = select(discover(FIXTURES), "sandbox", None)
    # By (order, name): 10, 20, 90, then the default 100.
    assert [e.name for e in suite] == ["gpu-xid-79", "node-crash", "budget-breach", "inject-fails"]
    assert [e.name for e in select(discover(FIXTURES), "slurm", None)] == ["rollback-fails"]
    assert select(discover(FIXTURES), "kubernetes", None) == []


def test_named_experiments_keep_the_given_order() -> None:
    suite = select(discover(FIXTURES), "sandbox", ["node-crash", "rollback-fails"])
    assert [e.name for e in suite] == ["node-crash", "rollback-fails"]


def test_unknown_names_list_what_exists() -> None:
    with pytest.raises(InputError) as e:
        select(discover(FIXTURES), "sandbox", ["gpu-xid-79", "nope"])
    assert [p.path for p in e.value.problems] == ["nope"]
    known = "known: budget-breach, gpu-xid-79, inject-fails, node-crash, rollback-fails"
    assert known in e.value.problems[0].message


def test_expectations_from_the_extension_entry() -> None:
    breach = {e.name: e for e in discover(FIXTURES)}["budget-breach"]
    assert breach.expect.outcome is Outcome.FAIL
    assert breach.fault_class == "gpu-fatal"
    assert breach.rollbacks == 1
    assert breach.configuration["gpufleet_budget_override"] == {"recoverSeconds": 20}


def test_bad_experiment_reports_every_problem() -> None:
    doc = {
        "title": "", "tags": "sandbox", "configuration": [], "rollbacks": {},
        "extensions": [{"name": "gpufleet", "expect_outcome": "MAYBE", "expect_isolation": "yes",
                        "expect_interruption": None, "order": "1", "colour": "red"}],
    }
    with pytest.raises(InputError) as e:
        parse_experiment(Path("x.json"), doc)
    assert [p.path for p in e.value.problems] == [
        "title", "tags", "configuration", "rollbacks", "extensions[0].colour",
        "extensions[0].expect_interruption", "extensions[0].expect_isolation",
        "extensions[0].expect_outcome", "extensions[0].order",
    ]
    moved = next(p for p in e.value.problems if p.path == "extensions[0].expect_isolation")
    assert moved.message == ("give expect_isolation as an argument of the steady-state probe "
                             "recovery_within_budget (chaos run judges with it too)")


def test_left_out_or_null_means_the_class_default() -> None:
    for args in ({}, {"expect_isolation": None, "expect_interruption": None}):
        doc = {"title": "t", "steady-state-hypothesis": hypothesis(args)}
        e = parse_experiment(Path("x.json"), doc).expect
        assert (e.isolation, e.interruption) == (None, None)
    assert parse_experiment(Path("y.json"), {"title": "t"}).expect.isolation is None


def test_discover_collects_problems_of_all_files(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text("{not json")
    (tmp_path / "b.json").write_text(json.dumps({"title": 3}))
    with pytest.raises(InputError) as e:
        discover(tmp_path)
    assert [p.path for p in e.value.problems] == ["a.json: line 1, column 2", "b.json: title"]


def hypothesis(args: dict[str, object]) -> dict[str, object]:
    return {"title": "h", "probes": [{"type": "probe", "name": "recovery-within-budget",
                                      "tolerance": BUDGET_TOLERANCE,
                                      "provider": {"type": "python", "module": PROBES_MODULE,
                                                   "func": "recovery_within_budget", "arguments": args}}]}


def test_expectations_from_the_budget_probe_and_tags() -> None:
    doc = {"title": "t", "steady-state-hypothesis": hypothesis({"expect_isolation": False,
                                                                "expect_interruption": True})}
    e = parse_experiment(Path("x.json"), doc).expect
    assert (e.isolation, e.interruption, e.outcome) == (False, True, Outcome.PASS)
    doc = {"title": "t", "tags": ["sandbox", "expect-deviation"],
           "steady-state-hypothesis": hypothesis({"expect_isolation": None})}
    e = parse_experiment(Path("x.json"), doc).expect
    assert (e.isolation, e.interruption, e.outcome) == (None, None, Outcome.FAIL)
    # The gpufleet extension entry's expect_outcome wins over the tag.
    doc["extensions"] = [{"name": "gpufleet", "expect_outcome": "PASS"}]
    e = parse_experiment(Path("x.json"), doc).expect
    assert e.outcome is Outcome.PASS


def test_a_probe_found_by_name_only_is_not_the_budget_probe() -> None:
    """One rule: the extension function called, not the activity's name."""
    doc = {"title": "t", "steady-state-hypothesis": hypothesis({"expect_isolation": False})}
    doc["steady-state-hypothesis"]["probes"][0]["provider"]["module"] = "elsewhere"  # type: ignore[index]
    assert parse_experiment(Path("x.json"), doc).expect.isolation is None


def test_bad_budget_probe_arguments() -> None:
    doc = {"title": "t", "steady-state-hypothesis": hypothesis({"expect_isolation": "no",
                                                                "expect_interruption": 1})}
    with pytest.raises(InputError) as e:
        parse_experiment(Path("x.json"), doc)
    assert [p.path for p in e.value.problems] == [
        "steady-state-hypothesis.probes[0].provider.arguments.expect_isolation",
        "steady-state-hypothesis.probes[0].provider.arguments.expect_interruption",
    ]


def test_known_issues_are_left_out_of_the_default_suite_but_run_by_name() -> None:
    from gpufleet.gameday.suite import left_out

    def exp(name: str, tags: list[str]) -> dict[str, object]:
        return {"title": name, "tags": tags, "configuration": {}, "rollbacks": []}

    exps = [
        parse_experiment(Path(f"{n}.json"), exp(n, t))
        for n, t in (("a", ["sandbox"]), ("b", ["sandbox", "known-issue"]), ("c", ["slurm", "known-issue"]))
    ]
    assert [e.name for e in select(exps, "sandbox", None)] == ["a"]
    assert left_out(exps, "sandbox") == ["b"]
    assert [e.name for e in select(exps, "sandbox", ["b"])] == ["b"]  # by name it runs


def test_fault_class_is_derived_from_the_fault_the_method_injects(tmp_path: Path) -> None:
    from gpufleet.gameday.suite import fault_id_of

    def act(func: str, module: str, **args: object) -> dict[str, object]:
        return {"type": "action", "name": func,
                "provider": {"type": "python", "module": module, "func": func, "arguments": args}}

    # An explicit fault_id wins; otherwise the action's own default (crash_node injects node-crash).
    gpu = act("inject_gpu_fault", "gpufleet.chaos.gpu.actions", fault_id="gpu-xid-94")
    assert fault_id_of(gpu) == "gpu-xid-94"
    assert fault_id_of(act("crash_node", "gpufleet.chaos.node.actions", node="@job:0")) == "node-crash"
    assert fault_id_of({"type": "probe", "provider": {}}) is None
    doc = {"title": "t", "configuration": {"gpufleet_backend": "sandbox"},
           "method": [act("hang_node", "gpufleet.chaos.node.actions", node="@job:0")]}
    assert parse_experiment(tmp_path / "x.json", doc).fault_class == "node-hang"
    doc["configuration"]["gpufleet_fault_class"] = "node-crash"  # stated: the extension checks agreement
    assert parse_experiment(tmp_path / "x.json", doc).fault_class == "node-crash"
    doc = {"title": "t", "method": []}
    assert parse_experiment(tmp_path / "x.json", doc).fault_class is None


def test_the_suite_holds_the_experiments_of_the_stacks_accelerators() -> None:
    real = discover(Path(__file__).parents[3] / "experiments")
    nvidia = {e.name for e in select(real, "sandbox", None, frozenset({"nvidia"}))}
    amd = {e.name for e in select(real, "sandbox", None, frozenset({"amd"}))}
    ascend = {e.name for e in select(real, "sandbox", None, frozenset({"huawei"}))}
    assert {"gpu-xid79-fallen-off-bus", "gpu-xid48-double-bit-ecc", "fabric-link-down"} <= nvidia
    assert not nvidia & {"amd-gpu-unhealthy", "ascend-npu-unhealthy", "ascend-link-down"}
    # The same GPU-fatal, ECC and link experiments on each vendor's sandbox; no XID one elsewhere.
    assert {"amd-gpu-unhealthy", "amd-gpu-ecc-uncorrectable", "fabric-link-down"} <= amd
    assert {"ascend-npu-unhealthy", "ascend-hbm-ecc-uncorrectable", "ascend-link-down"} <= ascend
    assert not any(n.startswith("gpu-xid") or n.startswith("ascend") for n in amd)
    assert not any(n.startswith("gpu-xid") or n.startswith("amd") for n in ascend)
    assert "node-crash" in amd & ascend & nvidia  # faults of any node run everywhere
    with pytest.raises(InputError) as e:
        select(real, "sandbox", ["gpu-xid79-fallen-off-bus"], frozenset({"amd"}))
    assert e.value.problems[0].message == "injects faults of nvidia accelerators; the stack has amd"
