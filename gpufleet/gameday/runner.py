"""Run a game-day: sandbox up if needed, one `chaos run` per experiment, judge, report.

Each experiment runs as a `chaos run --rollback-strategy=always` subprocess (docs/gameday.md says
why): the experiment runs exactly as a user's plain `chaos run` would, rollbacks are played even
when the method fails or is interrupted, a hung experiment can be stopped without taking the
game-day down, and the extension's signal handlers (Ctrl-C/SIGTERM revert) stay in their own
process. Everything the runner does is bounded in time.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.config import load_named_stack
from gpufleet.core.procs import alive
from gpufleet.core.sandbox_contract import KubeSandboxState, SandboxState, read_kube_state, read_state
from gpufleet.gameday.bundles import collect_for_report, sandbox_bundle_dir
from gpufleet.gameday.evaluate import ExperimentResult, evaluate
from gpufleet.gameday.journal import read_journal
from gpufleet.gameday.report.summary import SuiteRun
from gpufleet.gameday.suite import Experiment, catalog, discover, left_out, select
from gpufleet.slo import Budget

# SIGUSR1 makes chaostoolkit stop the run and play the rollbacks (conventions.md, Chaos Toolkit).
STOP_WITH_ROLLBACKS = signal.SIGUSR1


@dataclass(frozen=True)
class GamedayOptions:
    stack: str
    backend: str = "sandbox"
    experiments: tuple[str, ...] = ()
    report_dir: Path = Path("reports/gameday")
    keep_sandbox: bool = False
    experiments_dir: Path = Path("experiments")
    stacks_dir: Path = Path("stacks")
    experiment_timeout_s: float = 300.0  # a single experiment, rollbacks included
    # The Kubernetes sandbox's size (`sandbox up --kubernetes --nodes`); None: the stack's pools.
    kube_nodes: int | None = None
    rollback_grace_s: float = 90.0  # after SIGUSR1, time left for rollbacks before SIGTERM
    sandbox_timeout_s: float = 600.0
    # Pause between experiments. Each experiment ends only once its workload resumed and its nodes
    # returned, and the steady-state check below waits for what is still settling (an alert that
    # has not resolved yet): 2 s here healed nothing in three suites, so this is only a breath.
    settle_s: float = 0.5
    # Before each experiment: check the steady state, heal, and wait at most this long for it.
    steady_timeout_s: float = 150.0
    # (options, listener) -> HealReport JSON; None: ensure_steady_state (tests put a stand-in here).
    steady: Callable[[GamedayOptions, Listener, Experiment], dict[str, Any]] | None = None
    # Undoes the fault ledger after a run that was killed or left no journal; () = `gpufleet chaos revert`.
    revert_argv: tuple[str, ...] = ()
    python: str = sys.executable
    # The chaostoolkit CLI next to our interpreter; GPUFLEET_CHAOS_BIN points elsewhere.
    chaos_bin: str = field(default_factory=lambda: _default_chaos_bin())


def _default_chaos_bin() -> str:
    return os.environ.get("GPUFLEET_CHAOS_BIN") or str(Path(sys.executable).parent / "chaos")


class Listener:
    """Progress callbacks; the CLI renders them with rich, tests record them."""

    def suite_started(self, suite: list[Experiment]) -> None: ...
    def sandbox(self, message: str) -> None: ...
    def experiment_started(self, index: int, experiment: Experiment) -> None: ...
    def tick(self, index: int, experiment: Experiment, elapsed_s: float) -> None: ...
    def experiment_done(self, index: int, result: ExperimentResult) -> None: ...
    def healed(self, index: int, experiment: Experiment, report: dict[str, Any]) -> None: ...


def stack_budgets(stack: str, stacks_dir: Path) -> dict[str, Budget]:
    """The stack's slos.budgets as slo Budgets, keyed by fault-class value."""
    spec = load_named_stack(stack, stacks_dir)
    return {
        fc.value: Budget(b.detect_seconds, b.isolate_seconds, b.recover_seconds)
        for fc, b in spec.slos.budgets.items()
    }


# --------------------------------------------------------------------------- sandbox


def sandbox_status(state: SandboxState) -> tuple[str, str]:
    """("up" | "broken", why): broken = a state file whose run is not fully alive; it is torn
    down before a fresh `up`."""
    if state.phase != "up":
        return "broken", f"sandbox {state.stack} is {state.phase}"
    dead = [p.name for p in state.processes if not alive(p.pid, p.start_time)]
    if dead:
        return "broken", f"sandbox {state.stack} has dead processes: {', '.join(dead[:5])}"
    return "up", f"sandbox {state.stack} is up (run {state.run_id})"


def kube_sandbox_status(state: KubeSandboxState) -> tuple[str, str]:
    """("up" | "broken", why) of a Kubernetes sandbox's state file, as sandbox_status."""
    if state.phase != "up":
        return "broken", f"Kubernetes sandbox {state.stack} is {state.phase}"
    dead = [p.name for p in state.processes if not alive(p.pid, p.start_time)]
    if dead:
        return "broken", f"Kubernetes sandbox {state.stack} has dead processes: {', '.join(dead[:5])}"
    return "up", f"Kubernetes sandbox {state.stack} is up (run {state.run_id}, {len(state.nodes)} nodes)"


def uses_kube_sandbox(opts: GamedayOptions) -> bool:
    """A game-day on the kubernetes backend runs on the stack's Kubernetes sandbox when the stack is
    a sandbox stack (`cluster.environment: sandbox`); any other stack's is its real cluster (the
    game-day CronJob's in-cluster service account, or the kubeconfig)."""
    from gpufleet.config.model import Environment

    if opts.backend != "kubernetes":
        return False
    return load_named_stack(opts.stack, opts.stacks_dir).cluster.environment is Environment.SANDBOX


def _gpufleet(opts: GamedayOptions, *args: str) -> list[str]:
    return [opts.python, "-m", "gpufleet.cli.main", *args]


def _kube_flag(opts: GamedayOptions) -> list[str]:
    return ["--kubernetes"] if opts.backend == "kubernetes" else []


def ensure_sandbox(opts: GamedayOptions, listener: Listener) -> tuple[bool, float]:
    """Bring the stack's sandbox up unless it already is: the Slurm sandbox for the sandbox backend,
    the Kubernetes sandbox for the kubernetes backend (`--nodes` from `kube_nodes`). Returns (we
    brought it up, seconds)."""
    kube = opts.backend == "kubernetes"
    status: str
    try:
        status, why = kube_sandbox_status(read_kube_state(opts.stack)) if kube else sandbox_status(
            read_state(opts.stack))
    except (OSError, ValueError):
        status, why = "absent", f"no {'Kubernetes ' if kube else ''}sandbox state for {opts.stack}"
    flag = _kube_flag(opts)
    shown = " ".join(["gpufleet sandbox up", *flag, "--stack", opts.stack])
    if status == "up":
        listener.sandbox(why)
        return False, 0.0
    listener.sandbox(f"{why}: running `{shown}`")
    t = time.monotonic()
    if status == "broken":
        subprocess.run(_gpufleet(opts, "sandbox", "down", *flag, "--stack", opts.stack),
                       timeout=opts.sandbox_timeout_s, check=False)
    up_argv = _gpufleet(opts, "sandbox", "up", *flag, "--stack", opts.stack,
                        "--stacks-dir", str(opts.stacks_dir))
    if kube:
        up_argv += ["--timeout", f"{opts.sandbox_timeout_s:g}"]
        if opts.kube_nodes is not None:
            up_argv += ["--nodes", str(opts.kube_nodes)]
    down = " ".join(["gpufleet sandbox down", *flag, "--stack", opts.stack])
    try:
        proc = subprocess.run(up_argv, timeout=opts.sandbox_timeout_s + 30, check=False)
    except subprocess.TimeoutExpired:
        raise RuntimeError(
            f"`{shown}` did not finish in {opts.sandbox_timeout_s:g} s; clean up with `{down}`"
        ) from None
    if proc.returncode != 0:
        raise RuntimeError(
            f"`{shown}` failed (exit {proc.returncode}); see its output above, and `{down}` to clean up"
        )
    seconds = time.monotonic() - t
    listener.sandbox(f"{'Kubernetes ' if kube else ''}sandbox {opts.stack} up in {seconds:.1f} s")
    return True, seconds


def teardown_sandbox(opts: GamedayOptions, listener: Listener) -> None:
    flag = _kube_flag(opts)
    listener.sandbox(f"running `{' '.join(['gpufleet sandbox down', *flag, '--stack', opts.stack])}`")
    subprocess.run(_gpufleet(opts, "sandbox", "down", *flag, "--stack", opts.stack),
                   timeout=opts.sandbox_timeout_s, check=False)


# --------------------------------------------------------------------------- one experiment


def chaos_command(opts: GamedayOptions, experiment: Experiment, journal: Path, log: Path) -> list[str]:
    """`chaos run` with rollbacks always played. `--var` overrides only keys the experiment
    declares in its configuration (chaoslib.configuration.load_configuration), so stack and
    backend also travel as environment variables (GPUFLEET_STACK, GPUFLEET_BACKEND) for
    experiments that declare them as `{"type": "env"}`, and the stacks folder as GPUFLEET_STACKS_DIR,
    which the extension reads when an experiment does not name one (settings.stacks_dir_of)."""
    cmd = [opts.chaos_bin, "--log-file", str(log), "run", "--rollback-strategy=always",
           "--journal-path", str(journal)]
    for key, value in (("gpufleet_stack", opts.stack), ("gpufleet_backend", opts.backend)):
        if key in experiment.configuration:
            cmd += ["--var", f"{key}={value}"]
    return [*cmd, str(experiment.path)]


@dataclass(frozen=True)
class RunOutcome:
    journal: dict[str, Any] | None
    error: str | None
    wall_seconds: float


def _stop(proc: subprocess.Popen[bytes], grace_s: float) -> str:
    """Stop a run that overstayed: SIGUSR1 (rollbacks played), then SIGTERM, then SIGKILL."""
    for sig, wait in ((STOP_WITH_ROLLBACKS, grace_s), (signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            return "stopped"
        try:
            proc.wait(timeout=wait)
            return f"stopped with {signal.Signals(sig).name}"
        except subprocess.TimeoutExpired:
            continue
    return "could not be stopped"


def run_one(
    opts: GamedayOptions,
    experiment: Experiment,
    journal_path: Path,
    log_path: Path,
    tick: Callable[[float], None],
    env: Mapping[str, str] | None = None,
) -> RunOutcome:
    cmd = chaos_command(opts, experiment, journal_path, log_path)
    child_env = dict(env if env is not None else os.environ)
    child_env.update({"GPUFLEET_STACK": opts.stack, "GPUFLEET_BACKEND": opts.backend,
                      "GPUFLEET_STACKS_DIR": str(opts.stacks_dir.resolve())})
    journal_path.unlink(missing_ok=True)
    t = time.monotonic()
    error: str | None = None
    with open(log_path.with_suffix(".out"), "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env)
        try:
            while proc.poll() is None:
                elapsed = time.monotonic() - t
                if elapsed > opts.experiment_timeout_s:
                    how = _stop(proc, opts.rollback_grace_s)
                    error = f"timed out after {opts.experiment_timeout_s:g} s and was {how}"
                    if "SIGUSR1" not in how:
                        error += f"; {_revert(opts)}"
                    break
                tick(elapsed)
                time.sleep(0.5)
        except BaseException:
            # Ctrl-C reaches the child too (same process group); give its rollbacks time.
            _stop(proc, opts.rollback_grace_s)
            raise
    wall = time.monotonic() - t
    journal: dict[str, Any] | None = None
    try:
        loaded = json.loads(journal_path.read_text())
        journal = loaded if isinstance(loaded, dict) else None
    except (OSError, json.JSONDecodeError) as e:
        # Nothing says the rollbacks ran: undo whatever the ledger still holds.
        error = error or f"`chaos run` wrote no readable journal (exit {proc.returncode}): {e}"
        error += f"; {_revert(opts)}"
    return RunOutcome(journal, error, wall)


def _revert(opts: GamedayOptions) -> str:
    """Undo whatever the fault ledger still holds (the run was killed before its rollbacks)."""
    # --stack: a ConfigMap ledger ($GPUFLEET_LEDGER) is reached through the stack's Kubernetes sandbox.
    argv = list(opts.revert_argv) or _gpufleet(opts, "chaos", "revert", "--stack", opts.stack)
    shown = "gpufleet chaos revert" if not opts.revert_argv else " ".join(argv)
    try:
        proc = subprocess.run(argv, timeout=120, check=False, capture_output=True)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`{shown}` did not finish ({e}): run `gpufleet chaos revert` by hand"
    if proc.returncode == 0:
        return f"`{shown}` restored the ledger's faults"
    return f"`{shown}` failed (exit {proc.returncode}): run `gpufleet chaos revert` by hand"


# --------------------------------------------------------------------------- steady state


def _alerts_of(experiment: Experiment | None) -> frozenset[str]:
    if experiment is None:
        return frozenset()
    names = set()
    for fid in experiment.fault_ids:
        try:
            fault = catalog().get(fid)
        except KeyError:
            continue
        if fault.alert is not None:
            names.add(fault.alert.name)
    return frozenset(names)


def ensure_steady_state(
    opts: GamedayOptions, listener: Listener, experiment: Experiment | None = None
) -> dict[str, Any]:
    """Check the steady state before an experiment and heal it (gpufleet.chaos.steady.ensure). On a
    sandbox whose head daemons died, healing rebuilds the sandbox and checks again. Returns the
    HealReport as JSON (`ok` false: the experiment is not run and is judged UNKNOWN). The alerts that
    must detect `experiment`'s faults must not be firing already (from an earlier run's fault still in
    the alert's window), else its detection could not be measured. Once steady, the platform's
    restart budget is reset: a fault the game-day injects on purpose is not a crash loop."""
    from chaoslib.exceptions import ActivityFailed, InvalidActivity

    from gpufleet.chaos import engine, steady

    cfg = {"gpufleet_backend": opts.backend, "gpufleet_stack": opts.stack,
           "gpufleet_stacks_dir": str(opts.stacks_dir)}
    t = time.monotonic()
    actions: list[str] = []
    for attempt in (1, 2):
        try:
            ctx = engine.context(cfg)
            report = steady.ensure(ctx.backend, ctx.ledger, timeout_s=opts.steady_timeout_s,
                                   quiet=_alerts_of(experiment)).to_json()
            if report["ok"]:
                ctx.backend().reset_restart_budget()
        except (ActivityFailed, InvalidActivity) as e:
            report = {"problems": [str(e)], "actions": [], "seconds": 0.0, "ok": False, "remaining": [str(e)]}
        report["actions"] = actions + report["actions"]
        report["seconds"] = round(time.monotonic() - t, 1)
        if report["ok"] or not (opts.backend == "sandbox" or uses_kube_sandbox(opts)) or attempt == 2:
            return report
        # Healing in place failed (a head daemon died, the sandbox is gone): rebuild it once.
        listener.sandbox("steady state not restored in place: rebuilding the sandbox")
        actions = [*report["actions"], "rebuilt the sandbox"]
        first = report["problems"]
        teardown_sandbox(opts, listener)
        try:
            ensure_sandbox(opts, listener)
        except RuntimeError as e:
            report["remaining"] = [*report["remaining"], str(e)]
            return report
        # The sandbox was rebuilt: report the problems seen before it, not only after.
        report = {**report, "problems": first}
    return report


# --------------------------------------------------------------------------- the suite


def needs_fresh_training(index: int, brought_up: bool) -> bool:
    """On the Kubernetes sandbox, each experiment starts with a training Job that no fault has
    touched (gpufleet.sandbox.kube.cluster.restart_training says why): all but the first on a
    sandbox this game-day brought up."""
    return index > 0 or not brought_up


def fresh_training(opts: GamedayOptions, listener: Listener) -> None:
    """Replace the Kubernetes sandbox's training Job; a failure is left to the steady-state check
    that follows (which then reports the Job missing or not running)."""
    from gpufleet.sandbox.kube.cluster import restart_training

    try:
        seconds = restart_training(read_kube_state(opts.stack), load_named_stack(opts.stack, opts.stacks_dir))
    except Exception as e:  # any failure is reported; the steady-state check decides
        listener.sandbox(f"could not replace the training Job: {e}")
        return
    listener.sandbox(f"training Job replaced by a new one in {seconds:.1f} s (no back-off of earlier faults)")


def _ticker(listener: Listener, index: int, experiment: Experiment) -> Callable[[float], None]:
    def tick(elapsed_s: float) -> None:
        listener.tick(index, experiment, elapsed_s)

    return tick


def plan(opts: GamedayOptions) -> list[Experiment]:
    """The suite for the stack: its accelerators' vendors decide which GPU experiments apply."""
    vendors = frozenset(v.value for v in load_named_stack(opts.stack, opts.stacks_dir).vendors)
    return select(discover(opts.experiments_dir), opts.backend, list(opts.experiments) or None, vendors)


def run_gameday(opts: GamedayOptions, listener: Listener | None = None) -> SuiteRun:
    """Run the suite and return its judged results (the caller writes the report)."""
    listener = listener or Listener()
    started_at = time.time()
    t = time.monotonic()
    load_named_stack(opts.stack, opts.stacks_dir)  # a bad stack stops the game-day before any work
    suite = plan(opts)
    listener.suite_started(suite)
    journals = opts.report_dir / "journals"
    logs = opts.report_dir / "logs"
    journals.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    brought_up, setup_s = (False, 0.0)
    kube_sandbox = bool(suite) and uses_kube_sandbox(opts)
    if suite and (opts.backend == "sandbox" or kube_sandbox):
        brought_up, setup_s = ensure_sandbox(opts, listener)
    results: list[ExperimentResult] = []
    interrupted = False
    try:
        for i, exp in enumerate(suite):
            if i and opts.settle_s > 0:
                time.sleep(opts.settle_s)
            if kube_sandbox and needs_fresh_training(i, brought_up):
                fresh_training(opts, listener)
            healing = (opts.steady or ensure_steady_state)(opts, listener, exp)
            if healing["problems"]:
                listener.healed(i, exp, healing)
            listener.experiment_started(i, exp)
            run_started = time.time()
            jpath, lpath = journals / f"{exp.name}.json", logs / f"{exp.name}.log"
            if not healing["ok"]:
                why = (f"not run: cluster not in steady state after {healing['seconds']} s of healing: "
                       + "; ".join(healing["remaining"]))
                result = evaluate(exp, read_journal(None), journal=None, started_at=run_started,
                                  wall_seconds=0.0, error=why)
            else:
                outcome = run_one(opts, exp, jpath, lpath, _ticker(listener, i, exp))
                result = evaluate(
                    exp, read_journal(outcome.journal),
                    journal=str(jpath.relative_to(opts.report_dir)) if outcome.journal is not None else None,
                    started_at=run_started, wall_seconds=outcome.wall_seconds, error=outcome.error,
                )
            result = dataclasses.replace(result, healing=healing)
            if opts.backend in ("sandbox", "kubernetes"):  # the diagnostic bundles of this run
                found = collect_for_report(sandbox_bundle_dir(opts.stack, opts.backend), run_started,
                                           opts.report_dir)
                result = dataclasses.replace(result, extra={**result.extra, "bundles": found})
            results.append(result)
            listener.experiment_done(i, result)
    except KeyboardInterrupt:
        # The running experiment was stopped with its rollbacks (run_one); report what ran.
        interrupted = True
    finally:
        if brought_up and not opts.keep_sandbox:
            teardown_sandbox(opts, listener)
    return SuiteRun(
        stack=opts.stack, backend=opts.backend, started_at=started_at,
        wall_seconds=time.monotonic() - t, setup_seconds=setup_s, results=tuple(results),
        planned=tuple(e.name for e in suite), interrupted=interrupted,
        left_out=() if opts.experiments else tuple(left_out(discover(opts.experiments_dir), opts.backend)),
    )
