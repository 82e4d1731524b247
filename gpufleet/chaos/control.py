"""A Chaos Toolkit control that makes faults never outlive the run.

Declare it in an experiment:
    "controls": [{"name": "gpufleet-safety",
                  "provider": {"type": "python", "module": "gpufleet.chaos.control"}}]

- configure: starts a new run (its own run id in the ledger) and installs SIGINT/SIGTERM handlers
  that revert this run's faults at once, then interrupt the run (chaoslib turns SIGTERM into an
  exception that a running activity swallows as a failure, so the method would go on; and with its
  default rollback strategy an interrupted or failed run plays no rollbacks at all);
- before the experiment: the cluster must be in its steady state (gpufleet.chaos.steady: daemons
  up, nodes schedulable, nothing pending in the ledger, no critical alert, training progressing),
  else the run stops at once with "cluster not in steady state: ..." (not in dry-run);
- after the experiment (whatever its status: completed, failed, aborted, interrupted): reverts every
  fault of this run still in the ledger, so rollbacks run even when the method failed;
- a `kill -9` of the runner skips all of this: `gpufleet chaos revert` replays the ledger.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from chaoslib.types import Configuration, Experiment, Journal, Secrets

from gpufleet.chaos import engine
from gpufleet.chaos.settings import RUN_KEY

logger = logging.getLogger("chaostoolkit")

_previous: dict[int, Any] = {}
_configuration: dict[str, Any] = {}


def _revert_now(reason: str) -> None:
    try:
        results = engine.revert(_configuration, this_run_only=True)
    except Exception as e:  # reverting must never mask the interruption
        logger.error("gpufleet: revert on %s failed: %s", reason, e)
        return
    for r in results:
        logger.warning(
            "gpufleet: %s: reverted %s %s%s",
            reason,
            r.record.kind,
            r.record.target,
            "" if r.ok else f" FAILED: {r.error}",
        )


def _on_signal(signum: int, frame: FrameType | None) -> None:
    name = signal.Signals(signum).name
    logger.warning("gpufleet: %s received: reverting this run's faults", name)
    _revert_now(name)
    engine.run_of(_configuration).stop()
    # KeyboardInterrupt is the one exception chaoslib lets out of an activity and turns into an
    # "interrupted" run that still calls after_experiment_control.
    raise KeyboardInterrupt(name)


def configure_control(
    experiment: Experiment = None,
    configuration: Configuration = None,
    secrets: Secrets = None,
    **kwargs: Any,
) -> None:
    title = (experiment or {}).get("title", "experiment")
    # The run's id goes into the configuration dict every activity of this run is handed.
    run = engine.new_run(str(title), configuration if isinstance(configuration, dict) else None)
    _configuration.clear()
    _configuration.update(configuration or {})
    _configuration[RUN_KEY] = run.run_id
    stale = engine.ledger_pending_other_runs(_configuration, run.run_id)
    if stale:
        logger.warning(
            "gpufleet: %d fault(s) of earlier runs are still in the ledger %s: run `gpufleet chaos revert`",
            stale,
            engine.ledger_location_of(_configuration),
        )
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            _previous[sig] = signal.signal(sig, _on_signal)


def before_experiment_control(
    context: Experiment,
    configuration: Configuration = None,
    secrets: Secrets = None,
    **kwargs: Any,
) -> None:
    from chaoslib.exceptions import ActivityFailed, InterruptExecution, InvalidActivity

    from gpufleet.chaos import steady

    try:
        ctx = engine.context(configuration)
        if ctx.settings.dry_run:
            return
        found = steady.check(ctx.backend(), ctx.ledger)
    except (ActivityFailed, InvalidActivity) as e:
        raise InterruptExecution(f"cluster steady state unknown: {e}") from None
    if found:
        msg = "cluster not in steady state: " + "; ".join(found)
        msg += " (`gpufleet chaos steady --stack <stack> --heal` restores it)"
        logger.error("gpufleet: %s", msg)
        raise InterruptExecution(msg)


def after_experiment_control(
    context: Experiment,
    state: Journal = None,
    configuration: Configuration = None,
    secrets: Secrets = None,
    **kwargs: Any,
) -> None:
    engine.run_of(_configuration).stop()
    _revert_now(f"end of experiment ({(state or {}).get('status', 'unknown')})")


def cleanup_control() -> None:
    if threading.current_thread() is threading.main_thread():
        for sig, prev in list(_previous.items()):
            handler: Callable[[int, FrameType | None], Any] | int | None = prev
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    _previous.clear()
