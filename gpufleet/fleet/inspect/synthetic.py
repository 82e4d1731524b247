"""Seeded synthetic fleets for the lemon rule's tests and the planning benchmark: observations of a
pool whose healthy nodes vary run to run, and three degradations the issue names (a node at -15 %
collective bandwidth, a node with rising correctable ECC, a node with a flapping link).

These are SIMULATED observations (numpy, one seeded stream per fleet); nothing here measures a node.
The noise figures are our assumptions, stated where they are used."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from gpufleet.config.accelerators import AcceleratorModel
from gpufleet.fleet.inspect.observation import GpuObs, NodeObservation, PortObs

BUSBW_GBS = 460.0  # H100 reference (thresholds.yaml) as the healthy mean
BUSBW_CV = 0.02  # run-to-run spread of a healthy node: 2 % (our assumption)
HEALTHY_ECC_P = 0.05  # chance a healthy node logs one correctable error between sweeps (assumption)
HEALTHY_FLAP_P = 0.02  # chance a healthy port flaps once between sweeps (assumption)


@dataclass(frozen=True)
class Degradations:
    slow: str | None = None  # -15 % collective bandwidth
    ecc: str | None = None  # correctable ECC rising between sweeps
    flap: str | None = None  # a fabric port flapping between sweeps
    slow_factor: float = 0.85


def fleet_runs(nodes: list[str], runs: int, seed: int, deg: Degradations = Degradations(),
               interval_s: float = 3600.0, level_full: bool = True) -> Iterator[list[NodeObservation]]:
    """`runs` sweeps of the pool, one list of observations each."""
    rng = np.random.default_rng(seed)
    ecc = dict.fromkeys(nodes, 0.0)
    carrier = dict.fromkeys(nodes, 2)  # the link came up once at boot: two changes
    for i in range(runs):
        at = 1.8e9 + i * interval_s
        out = []
        for n in nodes:
            if n == deg.ecc:
                ecc[n] += float(rng.integers(20, 200))
            elif rng.random() < HEALTHY_ECC_P:
                ecc[n] += 1.0
            if n == deg.flap:
                carrier[n] += 2 * int(rng.integers(2, 6))
            elif rng.random() < HEALTHY_FLAP_P:
                carrier[n] += 2
            bw = BUSBW_GBS * (1.0 + BUSBW_CV * float(rng.standard_normal()))
            if n == deg.slow:
                bw *= deg.slow_factor
            gpus = tuple(GpuObs(index=g, ecc_correctable_volatile=ecc[n] if g == 0 else 0.0, pcie_gen=5,
                                pcie_width=16) for g in range(8))
            port = PortObs(name="fab0", state="up", speed_gbps=400.0, carrier_changes=carrier[n])
            out.append(NodeObservation(
                node=n, pool="gpu", sku=AcceleratorModel.H100_SXM, at=at, expected_gpus=8, sched_state="idle",
                gpus=gpus, ports=(port,),
                expected_port_gbps=400.0, perf={"nccl_allreduce_busbw_gbs": bw} if level_full else {},
            ))
        yield out
