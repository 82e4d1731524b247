# Runs one Pulumi Python program for gpufleet's language host (main.go starts `python -c <this>`).
#
# The host hands over one JSON document in the environment variable GPUFLEET_PULUMI_RUN (main.go,
# type runDocument): the program's path and arguments, its working directory, the stack's
# configuration and secret keys, and the engine's settings. The program runs as __main__ inside the
# SDK's stack resource (pulumi.runtime.run_in_stack). The exit status is what the host reports:
# 0 done; 32 failed, with the error already logged through the engine (the host answers "bail", so
# the engine prints nothing more); any other status, failed with nothing logged.
#
# The project pins the Python SDK (pyproject.toml), so this runner uses that SDK's API as it is,
# without probing for older or newer signatures.
from __future__ import annotations

import asyncio
import json
import os
import runpy
import sys
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any

LOGGED = 32


def _report(message: str) -> int:
    import pulumi

    pulumi.log.error(message)
    return LOGGED


def _program(path: str) -> None:
    """Run the program as `python <path>` would; a folder needs its __main__.py."""
    if os.path.isdir(path) and not os.path.exists(os.path.join(path, "__main__.py")):
        raise FileNotFoundError(f"{path} is a folder without __main__.py; Pulumi.yaml's `main` must name one")
    runpy.run_path(path, run_name="__main__")


def run(doc: dict[str, Any]) -> int:
    import pulumi
    import pulumi.runtime

    s = doc["settings"]
    parallel = int(s["parallel"]) or 1
    pulumi.runtime.set_all_config(doc["config"], doc["secretKeys"])
    pulumi.runtime.configure(
        pulumi.runtime.Settings(
            project=s["project"],
            stack=s["stack"],
            monitor=s["monitor"],
            engine=s["engine"] or None,
            parallel=parallel,
            dry_run=bool(s["dryRun"]),
            organization=s["organization"] or None,
            root_directory=s["rootDirectory"] or None,
        )
    )
    program = os.path.abspath(doc["program"])
    sys.argv = [doc["program"], *doc["args"]]
    if doc["pwd"]:
        os.chdir(doc["pwd"])
    # The SDK sends each registration, read and invoke from a thread of the loop's default executor
    # and holds the thread until the engine answers; a registration is answered when its step ends.
    # The engine runs `parallel` steps at once, so that many threads are busy waiting, and the
    # headroom keeps invokes and reads from queueing behind them.
    pool = ThreadPoolExecutor(max_workers=parallel + 32, thread_name_prefix="pulumi-rpc")
    with pool, asyncio.Runner() as runner:
        loop = runner.get_loop()
        loop.set_default_executor(pool)
        # A failed program leaves futures nobody awaits; asyncio's reports of them would bury the
        # one error that matters, which is logged below.
        loop.set_exception_handler(lambda _loop, _context: None)
        try:
            runner.run(pulumi.runtime.run_in_stack(lambda: _program(program)))
        except pulumi.RunError as e:
            return _report(str(e))
        except SystemExit as e:
            return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except Exception:
            return _report(f"the program {doc['program']} raised an exception:\n{traceback.format_exc()}")
    return 0


def main() -> int:
    try:
        doc = json.loads(os.environ["GPUFLEET_PULUMI_RUN"])
    except (KeyError, ValueError) as e:
        print(f"gpufleet's Pulumi runner: no run document in GPUFLEET_PULUMI_RUN ({e})", file=sys.stderr)
        return 2
    try:
        import pulumi  # noqa: F401
    except ImportError as e:
        print(
            f"gpufleet's Pulumi runner: {e}. The environment that runs the program lacks the pulumi "
            "package: install the project into the virtual environment Pulumi.yaml names "
            "(runtime.options.virtualenv), e.g. with `make venv`.",
            file=sys.stderr,
        )
        return 1
    try:
        return run(doc)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


sys.exit(main())
