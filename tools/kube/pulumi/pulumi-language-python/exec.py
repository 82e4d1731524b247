# Run one Pulumi Python program for the language host (main.go runs `python -c <this file>`).
#
# The project's own code (ADR 0035), written from what a Python program needs under the engine:
# the stack's configuration from the environment, the runtime settings from the arguments, the
# program run as __main__ inside pulumi.runtime.run_in_stack, and an exit status the host reads
# (0 done, 1 failed, 32 failed after an error was already shown to the user).
from __future__ import annotations

import argparse
import asyncio
import inspect
import logging
import os
import runpy
import sys
import traceback
from concurrent.futures import ThreadPoolExecutor

SHOWN = 32  # the host turns this into a "bail": the error was already reported through the engine

try:
    import pulumi
    import pulumi.runtime
except ImportError:
    print(traceback.format_exc(), file=sys.stderr)
    print(
        "The Pulumi SDK is not installed in the Python environment that runs this program: install the "
        "`pulumi` package into the virtual environment Pulumi.yaml names (runtime.options.virtualenv).",
        file=sys.stderr,
    )
    sys.exit(1)


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="pulumi-language-python-exec")
    for flag in (
        "project",
        "root_directory",
        "stack",
        "parallel",
        "dry_run",
        "pwd",
        "monitor",
        "engine",
        "tracing",
        "organization",
    ):
        ap.add_argument(f"--{flag}")
    ap.add_argument("PROGRAM")
    ap.add_argument("ARGS", nargs="*")
    return ap.parse_args(argv)


def configure(args: argparse.Namespace) -> pulumi.runtime.Settings:
    config = pulumi.runtime.get_config_env()
    if hasattr(pulumi.runtime, "set_all_config"):
        pulumi.runtime.set_all_config(config, pulumi.runtime.get_config_secret_keys_env())
    else:  # an older SDK: one key at a time
        for key, value in config.items():
            pulumi.runtime.set_config(key, value)
    wanted = {
        "monitor": args.monitor,
        "engine": args.engine,
        "project": args.project,
        "stack": args.stack,
        "parallel": int(args.parallel) if args.parallel else None,
        "dry_run": args.dry_run == "true",
        "organization": args.organization,
        "root_directory": args.root_directory,
    }
    accepted = inspect.signature(pulumi.runtime.Settings.__init__).parameters
    settings = pulumi.runtime.Settings(**{k: v for k, v in wanted.items() if k in accepted})
    pulumi.runtime.configure(settings)
    return settings


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    settings = configure(args)
    program = os.path.abspath(args.PROGRAM)
    sys.argv = [args.PROGRAM, *args.ARGS]
    if args.pwd:
        os.chdir(args.pwd)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    executor = None
    if settings.parallel is not None:
        executor = ThreadPoolExecutor(max_workers=max(settings.parallel, 1) * 4)
        loop.set_default_executor(executor)
    # Futures left unobserved when a program fails are expected under Pulumi's model; asyncio's
    # complaints about them would only bury the real error.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)

    def run() -> None:
        if os.path.isdir(program) and not os.path.isfile(os.path.join(program, "__main__.py")):
            pulumi.log.error(f"no __main__.py in the program folder {program}")
            sys.exit(SHOWN)
        runpy.run_path(program, run_name="__main__")

    status = 1
    try:
        loop.run_until_complete(pulumi.runtime.run_in_stack(run))
        status = 0
    except pulumi.RunError as exc:
        pulumi.log.error(str(exc))
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
    except Exception:
        pulumi.log.error("Program failed with an unhandled exception:\n" + traceback.format_exc())
        status = SHOWN
    finally:
        if executor is not None:
            executor.shutdown(wait=True)
        loop.close()
        sys.stdout.flush()
        sys.stderr.flush()
    return status


sys.exit(main(sys.argv[1:]))
