"""A run's pollers are stopped when its process ends, before the interpreter finalizes: activities
called from Python outside a Chaos Toolkit run leave them running, and a daemon thread caught in a
socket call at finalization aborted a whole pytest process (exit 134) after its tests had passed."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_an_ad_hoc_runs_pollers_are_stopped_at_exit() -> None:
    # atexit runs its handlers last-registered first: this one is registered before gpufleet's
    # engine is imported, so it looks at the threads after the engine's handler has run.
    code = textwrap.dedent("""
        import atexit, threading

        def after() -> None:
            alive = [t.name for t in threading.enumerate() if t.name.startswith("gpufleet-")]
            print("alive at exit:", alive, flush=True)

        atexit.register(after)

        from gpufleet.chaos import engine
        from gpufleet.chaos.watch import SchedulerWatcher

        run = engine.run_of({})  # an ad-hoc run: no control will stop it
        w = SchedulerWatcher(lambda: {}, interval=0.01)
        w.start()
        run.watchers.append(w)
        print("started:", w._thread is not None and w._thread.is_alive(), flush=True)
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["started: True", "alive at exit: []"], res.stdout + res.stderr
