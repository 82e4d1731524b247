"""Reading a GPU host's own state: the kernel log's XID lines, `nvidia-smi`, and the fabric ports in
sysfs. Shared by node health (gpufleet.health) and fleet inspection (gpufleet.fleet.inspect), which
are sibling layers, so the readers live here once. Pure parsers beside thin readers; a reader that
cannot read raises HostReadError with why, and its caller reports that as UNKNOWN, never healthy.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence

CMD_TIMEOUT_S = 10.0


class HostReadError(Exception):
    """A host source could not be read; the message says which and why."""


def run_tool(argv: Sequence[str], *, timeout: float = CMD_TIMEOUT_S) -> str:
    """Run a host tool found on PATH and return its stdout; HostReadError when it is missing,
    hangs past `timeout` or exits non-zero (with the start of what it printed)."""
    exe = shutil.which(argv[0])
    if exe is None:
        raise HostReadError(f"{argv[0]} not found")
    try:
        res = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise HostReadError(f"{argv[0]}: no answer in {timeout:g} s") from None
    except OSError as e:
        raise HostReadError(f"{argv[0]}: {e.strerror}") from None
    if res.returncode != 0:
        said = (res.stderr or res.stdout).strip()[:200]
        raise HostReadError(f"{argv[0]} exited {res.returncode}: {said}")
    return res.stdout
