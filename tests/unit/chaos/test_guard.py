from gpufleet.chaos.guard import blast_radius, production_gate, takes_node_down


def test_within_limit_and_spares_is_allowed() -> None:
    assert blast_radius([], ["gpu-0"], total_nodes=5, spares=1, max_nodes_down=2) == []


def test_more_than_max_nodes_down_is_refused() -> None:
    reasons = blast_radius(["gpu-0", "gpu-1"], ["gpu-2"], 5, spares=3, max_nodes_down=2)
    assert len(reasons) == 1
    assert "maxNodesDown=2" in reasons[0] and "gpu-2" in reasons[0]


def test_taking_the_last_spare_needs_explicit_opt_in() -> None:
    refused = blast_radius(["gpu-0"], ["gpu-1"], 5, spares=1, max_nodes_down=2)
    assert len(refused) == 1 and "last spare" in refused[0]
    assert blast_radius(["gpu-0"], ["gpu-1"], 5, 1, 2, allow_spare_exhaustion=True) == []


def test_opt_in_never_lifts_the_hard_limit() -> None:
    reasons = blast_radius(["gpu-0", "gpu-1"], ["gpu-2"], 5, 1, 2, allow_spare_exhaustion=True)
    assert len(reasons) == 1 and "maxNodesDown" in reasons[0]


def test_a_node_already_down_is_not_counted_twice() -> None:
    assert blast_radius(["gpu-0"], ["gpu-0"], 5, 1, 1) == []


def test_never_every_node() -> None:
    reasons = blast_radius(["a"], ["b"], total_nodes=2, spares=5, max_nodes_down=5)
    assert reasons == ["refusing to take all 2 nodes down"]


def test_production_needs_opt_in() -> None:
    assert production_gate("production", False) is not None
    assert production_gate("production", True) is None
    assert production_gate("sandbox", False) is None


def test_which_faults_take_a_node_down() -> None:
    assert takes_node_down("dcgm-inject", "gpu-fatal")
    assert not takes_node_down("dcgm-inject", "gpu-contained")
    assert takes_node_down("link-down", None)
    assert not takes_node_down("link-degrade", "fabric-degraded")


def test_classes_take_nodes_down_by_their_traits() -> None:
    """gpufleet.core.taxonomy's table, not a list of its own: switch-down and maintenance count."""
    assert takes_node_down("dcgm-inject", "fabric-switch-down")
    assert takes_node_down("cordon", "node-maintenance")
    assert not takes_node_down("dcgm-inject", "fabric-flap")  # may or may not isolate: not counted
    assert not takes_node_down("kill-rank", "workload")
    assert not takes_node_down("dcgm-inject", "meteor")


def test_a_refusal_at_scale_names_ten_nodes_and_counts_the_rest() -> None:
    down = {f"n{i:04d}" for i in range(700)}
    (reason, spare) = blast_radius(down, {"n0700"}, 1250, 30, 10)
    assert reason == ("taking n0700 down would leave 701 node(s) down (n0000, n0001, n0002, n0003, "
                      "n0004, n0005, n0006, n0007, n0008, n0009 and 691 more); the stack allows "
                      "gameday.maxNodesDown=10")
    assert spare.startswith("701 node(s) down would exceed the 30 spare(s)")
