"""`gpufleet sandbox up|status|down|doctor --storage`: the storage sandbox (a real Ceph cluster on
loopback, docs/storage.md). Called from sandbox_cmds; kept here so the Ceph imports stay out of the
other sandbox commands."""

from __future__ import annotations

import json

import typer

from gpufleet.cli.common import console, fail
from gpufleet.cli.recorded_run_cmds import RunKind, print_header, print_processes, require_run, take_down
from gpufleet.config.model import StackSpec


def storage_up(stack: str, spec: StackSpec, timeout: float) -> None:
    from gpufleet.sandbox.storage.ceph import StorageSandboxError, StorageUpOptions
    from gpufleet.sandbox.storage.ceph import storage_up as up

    try:
        rec, timings = up(
            stack, spec, StorageUpOptions(timeout_s=timeout), say=lambda m: console.print(m, highlight=False)
        )
    except (StorageSandboxError, TimeoutError, OSError) as e:
        raise fail(
            f"{e}\n(state kept for cleanup: run `gpufleet sandbox down --storage --stack {stack}`)"
        ) from None
    st = rec.state
    marks = ", ".join(f"{k} {v:.1f} s" for k, v in timings.marks.items())
    console.print(
        f"storage sandbox [bold]{stack}[/] up (run {st.run_id}): {len(st.osds)} OSDs, S3 {st.s3_endpoint}, "
        f"buckets {st.checkpoint_bucket} and {st.backup_bucket}; {marks}",
        highlight=False,
    )
    console.print(f"  try: ceph -c {st.ceph_conf} -s", highlight=False, soft_wrap=True)
    console.print(f"  prometheus (the catalog's rules): {st.prometheus_url}", highlight=False, soft_wrap=True)
    console.print(f"  state: {rec.path}", highlight=False, soft_wrap=True)


STORAGE_RUN = RunKind("storage sandbox", "--storage")


def storage_status(stack: str, as_json: bool) -> None:
    from gpufleet.sandbox.storage.ceph import existing_storage
    from gpufleet.sandbox.storage.ceph import storage_status as status

    info = status(require_run(STORAGE_RUN, stack, existing_storage))
    if as_json:
        print(json.dumps(info, indent=2))
        return
    print_header(STORAGE_RUN, info)
    console.print(
        f"  {info['ceph_version']}; S3 {info['s3_endpoint']}; buckets {info['buckets']}; "
        f"prometheus {info['prometheus_url']}",
        highlight=False,
    )
    print_processes(info)
    if info["health"] is not None:
        checks = info["health"]["checks"]
        console.print(
            f"  health: {info['health']['status']}" + (f" ({', '.join(checks)})" if checks else ""),
            highlight=False,
        )
    if info["error"]:
        console.print(f"  [red]{info['error']}[/]", highlight=False)


def storage_down(stack: str, all_: bool, keep_files: bool, quiet_if_none: bool = False) -> bool:
    """Remove the storage sandbox(es); True when everything asked for is gone."""
    from gpufleet.sandbox.storage.ceph import StorageSandboxError, all_storage_stacks
    from gpufleet.sandbox.storage.ceph import storage_down as down

    stacks = all_storage_stacks() if all_ else [stack]
    return take_down(
        STORAGE_RUN, stacks, lambda s: down(s, keep_files=keep_files), StorageSandboxError, quiet_if_none
    )


def storage_doctor() -> None:
    from gpufleet.sandbox.storage.doctor import diagnose_storage

    checks = diagnose_storage()
    for c in checks:
        mark = "[green]ok[/]     " if c.ok else "[red]MISSING[/]"
        console.print(f"{mark} {c.name}: {c.detail}", highlight=False)
        if c.fix:
            console.print(f"        fix: {c.fix}", highlight=False, soft_wrap=True)
    if not all(c.ok for c in checks):
        raise typer.Exit(1)
