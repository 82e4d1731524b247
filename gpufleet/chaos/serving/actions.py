"""Serving actions: start the load an experiment's fault is judged under; restart every replica.

`start_load` runs Locust in the background (gpufleet.chaos.serving.load): bounded in users, rate
and run time, stopped with the run whatever ends it, and, in the sandbox, inside its head network
namespace against the balancer, so its traffic never leaves the sandbox's namespaces. The verdict
reads what it recorded (gpufleet.chaos.workload.probes.recovery_within_budget)."""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import Any

from chaoslib.exceptions import ActivityFailed, InvalidActivity
from chaoslib.types import Configuration, Secrets

from gpufleet.chaos import engine
from gpufleet.chaos.backends.base import Backend
from gpufleet.chaos.serving import load
from gpufleet.core.serving_records import read_records

__all__ = ["restore_replicas", "rolling_restart", "start_load"]


logger = logging.getLogger("chaostoolkit")
LOADS_DIR = Path(tempfile.gettempdir()) / "gpufleet" / "loads"
FIRST_REQUEST_TIMEOUT_S = 30.0  # Locust imports gevent and spawns its users in ~1.5 s on 2 cores


def start_load(
    duration_seconds: float = 60.0,
    users: int | None = None,
    rate_per_user: float | None = None,
    warmup_seconds: float = 3.0,
    request_timeout_seconds: float = 5.0,
    configuration: Configuration = None,
    secrets: Secrets = None,
) -> dict[str, Any]:
    """Start the serving load for `duration_seconds` (it stops by itself) and return once requests
    have flowed for `warmup_seconds`, so the fault that follows hits a loaded service. `users` and
    `rate_per_user` left out are the stack's `sandbox.serving` ones. The balancer is the backend's
    serving workload, else the configuration's `gpufleet_serving_url`."""
    ctx = engine.context(configuration)
    target = ctx.backend().serving()
    url = ctx.settings.serving_url or (target.url if target is not None else None)
    if url is None:
        raise InvalidActivity(
            "no serving workload to load: the backend runs none (a sandbox stack needs sandbox.serving) "
            "and gpufleet_serving_url is not set"
        )
    netns = target.netns if target is not None and url == target.url else None
    stack_load = ctx.stack.sandbox.serving if ctx.stack and ctx.stack.sandbox else None
    users = users if users is not None else stack_load.users if stack_load else None
    rate = rate_per_user if rate_per_user is not None else stack_load.rate_per_user if stack_load else None
    if users is None or rate is None:
        raise InvalidActivity("users and rate_per_user: set them (the stack has no sandbox.serving)")
    if not 0 <= warmup_seconds < duration_seconds:
        raise InvalidActivity(f"warmup_seconds must be in [0, duration_seconds), got {warmup_seconds:g}")
    spec = load.LoadSpec(url, users, rate, duration_seconds, request_timeout_seconds)
    bad = spec.problems()
    if bad:
        raise InvalidActivity("serving load: " + "; ".join(bad))
    run = ctx.run
    with run.lock:
        records = LOADS_DIR / f"{run.run_id}-{len(run.loads)}"
        log = records / "locust.log"
        proc = load.start(spec, records, log, netns)
        started = load.LoadRun(spec, proc, records, log, time.time())
        run.loads.append(started)
    deadline = time.monotonic() + FIRST_REQUEST_TIMEOUT_S
    first: float | None = None
    while first is None:
        if proc.poll() is not None:
            raise ActivityFailed(f"Locust ended at once (exit {proc.returncode}); see {log}")
        if time.monotonic() > deadline:
            started.stop()
            raise ActivityFailed(f"no request recorded {FIRST_REQUEST_TIMEOUT_S:g} s after Locust started; "
                                 f"see {log}")
        got = [r.t for lines in read_records(records).values() for r in lines]
        first = min(got) if got else None
        if first is None:
            time.sleep(0.2)
    time.sleep(max(0.0, first + warmup_seconds - time.time()))
    logger.info("gpufleet: serving load on %s: %d users x %g/s for %g s (records %s)",
                url, users, rate, duration_seconds, records)
    return {"url": url, "users": users, "rate_per_user": rate, "duration_seconds": duration_seconds,
            "records": str(records), "first_request_at": first, "netns": netns}


def rolling_restart(
    drain_timeout_seconds: float = 10.0,
    ready_timeout_seconds: float = 60.0,
    configuration: Configuration = None,
    secrets: Secrets = None,
) -> dict[str, Any]:
    """Restart every replica of the backend's serving workload, one at a time: drained in the
    balancer (no new requests; those in progress finish, bounded by `drain_timeout_seconds`),
    stopped, started again, back in the rotation once ready (bounded by `ready_timeout_seconds`).
    Each restart is written to the fault ledger before it starts, so a run cut off leaves no replica
    stopped or drained. With a balancer that drains correctly, no request fails."""
    for name, value in (("drain_timeout_seconds", drain_timeout_seconds),
                        ("ready_timeout_seconds", ready_timeout_seconds)):
        if not 0 < value <= 600:
            raise InvalidActivity(f"{name} must be in (0, 600] seconds, got {value:g}")
    target = engine.context(configuration).backend().serving()
    if target is None:
        raise InvalidActivity("the backend runs no serving workload to restart")
    done = []
    for replica in target.replicas:
        out = engine.run_plan(
            configuration,
            lambda b, r=replica: b.plan_replica_restart(r, drain_timeout_seconds, ready_timeout_seconds),
            None,
        )
        done.append({"replica": replica, **out.get("result", {})})
        logger.info("gpufleet: replica %s restarted: %s", replica, out.get("result"))
    return {"restarted": done}


def restore_replicas(configuration: Configuration = None, secrets: Secrets = None) -> dict[str, Any]:
    """Rollback of `rolling_restart`: any restart still pending in the ledger (the run was cut off
    mid-restart) is undone: the replica started again if it is not running, and put back in the
    balancer's rotation."""
    return engine.revert_summary(engine.revert(configuration, frozenset({Backend.REPLICA_RESTART})))
