"""Mount points read from mountinfo, and a folder made a shared mount so later mounts inside it reach
the sandbox's node namespaces.

Why a shared mount: `ip netns exec` gives each node's processes a mount namespace of their own, a
copy of the root one taken when they start, made a slave of it (iproute2's netns exec: unshare(2)
CLONE_NEWNS, then `/` remounted MS_SLAVE|MS_REC). A slave copy receives later mounts and unmounts
only from a mount that was *shared* when the copy was taken (the kernel's shared-subtree rules,
Documentation/filesystems/sharedsubtree.rst); on these machines `/` is private. So a JuiceFS
volume mounted, or mounted again after its client died, under a folder that is a shared mount shows
up in every node namespace started after the folder became one; under a private folder it never
would, and a node would keep the dead client's mount.

mountinfo's fields (proc(5)): mount ID, parent ID, major:minor, root, mount point, options, then
optional fields such as `shared:N` or `master:N` up to a lone `-`, then the file system type.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

MOUNT_TIMEOUT_S = 30


class MountError(RuntimeError):
    """A mount(8) or umount(8) command failed."""


@dataclass(frozen=True)
class MountEntry:
    mount_point: str
    fs_type: str
    shared: bool  # in a peer group (`shared:N`): mounts under it propagate to its slaves
    device: str = ""  # st_dev as `major:minor` (field 3); a FUSE mount's minor names its connection


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash in paths as octal escapes (\040 ...).
    out, i = [], 0
    while i < len(field):
        code = field[i + 1 : i + 4]
        if field[i] == "\\" and len(code) == 3 and code.isdigit():
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[MountEntry]:
    """Every mount of a /proc/<pid>/mountinfo text, in its order (later mounts stack on earlier)."""
    out: list[MountEntry] = []
    for line in text.splitlines():
        parts = line.split()
        if "-" not in parts[6:]:
            continue
        sep = parts.index("-", 6)
        if len(parts) <= sep + 1:
            continue
        shared = any(o.startswith("shared:") for o in parts[6:sep])
        out.append(MountEntry(_unescape(parts[4]), parts[sep + 1], shared, parts[2]))
    return out


def mounts_at(path: str, text: str) -> list[MountEntry]:
    """The mounts stacked at `path`, the one visible last."""
    return [m for m in parse_mountinfo(text) if m.mount_point == path]


def read_mountinfo(pid: int | None = None) -> str:
    return Path(f"/proc/{pid or 'self'}/mountinfo").read_text()


def _run(argv: list[str]) -> None:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=MOUNT_TIMEOUT_S)
    if res.returncode != 0:
        raise MountError(f"{' '.join(argv)} failed (exit {res.returncode}): {res.stderr.strip()[-400:]}")


def make_shared(folder: Path) -> bool:
    """Make `folder` a shared mount (a bind mount of itself when it is not a mount point); True
    when this call made the bind mount. Idempotent: a folder already a shared mount is left alone."""
    here = mounts_at(str(folder), read_mountinfo())
    if here and here[-1].shared:
        return False
    made = not here
    if made:
        _run(["mount", "--bind", str(folder), str(folder)])
    _run(["mount", "--make-shared", str(folder)])
    return made


def unbind(folder: Path) -> None:
    """Undo make_shared's bind mount; lazily when busy (a node's process may still hold a file under
    it). Nothing to do when `folder` is not a mount point."""
    if not mounts_at(str(folder), read_mountinfo()):
        return
    try:
        _run(["umount", str(folder)])  # a plain unmount also reaches the slave copies
    except MountError:
        _run(["umount", "-l", str(folder)])
