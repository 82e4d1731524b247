"""core.mounts: mountinfo read as proc(5) lays it out, and the shared bind mount made and undone once."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.core import mounts

# Lines in the layout of this machine's /proc/self/mountinfo (proc(5)): a private root, a shared
# bind of a folder, a JuiceFS mount on it, the same folder seen as a slave in a node's namespace,
# and a path with a space (written \040).
MOUNTINFO = """\
50 1 254:0 / / rw,relatime - ext4 /dev/vda rw
73 50 254:0 /run/s/juicefs /run/s/juicefs rw,relatime shared:3 - ext4 /dev/vda rw
80 73 0:61 / /run/s/juicefs/mnt rw,relatime shared:4 - fuse.juicefs JuiceFS:jfs rw,user_id=0
91 50 254:0 /run/s/juicefs /run/s/juicefs rw,relatime master:3 - ext4 /dev/vda rw
95 50 0:42 / /tmp/a\\040b rw,relatime - tmpfs none rw
"""


def test_mountinfo_is_read_with_its_optional_fields_and_escapes() -> None:
    got = mounts.parse_mountinfo(MOUNTINFO)
    assert [(m.mount_point, m.fs_type, m.shared) for m in got] == [
        ("/", "ext4", False),
        ("/run/s/juicefs", "ext4", True),
        ("/run/s/juicefs/mnt", "fuse.juicefs", True),
        ("/run/s/juicefs", "ext4", False),  # master:3 is a slave, not a member of the peer group
        ("/tmp/a b", "tmpfs", False),
    ]


def test_mounts_stacked_at_a_path_come_in_order_and_a_torn_line_is_skipped() -> None:
    assert [m.shared for m in mounts.mounts_at("/run/s/juicefs", MOUNTINFO)] == [True, False]
    assert mounts.mounts_at("/run/s", MOUNTINFO) == []
    assert mounts.parse_mountinfo("12 1 0:1 / /x rw shared:1\n") == []  # no `-` and no type


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    calls: list[list[str]] = []
    monkeypatch.setattr(mounts, "_run", calls.append)
    return calls


def test_a_plain_folder_is_bound_on_itself_then_made_shared(
    monkeypatch: pytest.MonkeyPatch, recorded: list[list[str]]
) -> None:
    monkeypatch.setattr(mounts, "read_mountinfo", lambda pid=None: MOUNTINFO)
    assert mounts.make_shared(Path("/run/t/juicefs")) is True
    assert recorded == [
        ["mount", "--bind", "/run/t/juicefs", "/run/t/juicefs"],
        ["mount", "--make-shared", "/run/t/juicefs"],
    ]


def test_a_shared_folder_is_left_alone_and_a_private_mount_point_only_made_shared(
    monkeypatch: pytest.MonkeyPatch, recorded: list[list[str]]
) -> None:
    monkeypatch.setattr(mounts, "read_mountinfo", lambda pid=None: MOUNTINFO)
    assert mounts.make_shared(Path("/run/s/juicefs/mnt")) is False
    assert mounts.make_shared(Path("/tmp/a b")) is False
    assert recorded == [["mount", "--make-shared", "/tmp/a b"]]


def test_unbind_unmounts_only_a_mount_point_and_falls_back_to_a_lazy_unmount(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(mounts, "read_mountinfo", lambda pid=None: MOUNTINFO)
    calls: list[list[str]] = []

    def busy(argv: list[str]) -> None:
        calls.append(argv)
        if "-l" not in argv:
            raise mounts.MountError("target is busy")

    monkeypatch.setattr(mounts, "_run", busy)
    mounts.unbind(Path("/run/s"))  # not a mount point
    assert calls == []
    mounts.unbind(Path("/run/s/juicefs"))
    assert calls == [["umount", "/run/s/juicefs"], ["umount", "-l", "/run/s/juicefs"]]


def test_a_failing_mount_command_names_itself_and_its_error(tmp_path: Path) -> None:
    with pytest.raises(mounts.MountError, match=r"umount .*nothing-here.* failed \(exit"):
        mounts._run(["umount", str(tmp_path / "nothing-here")])
