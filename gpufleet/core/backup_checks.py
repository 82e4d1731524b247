"""What every proven backup shares (pure): the sharp-shrink rule and the choice of the backup a
restore takes. The JuiceFS metadata dumps (core.juicefs) and the Slurm state backups
(core.slurm_state_backups) are both judged by these, each with its own counts.

A backup counts only once it was restored somewhere and checked; a restore takes the newest one
whose evidence says so, never a newer one that failed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar

# A backup whose count (inodes, jobs) falls below this share of the previous verified backup's is
# a failed backup: a training cluster's file system or queue grows and turns over; losing half of it
# at once is what an emptied or truncated store looks like, not retention.
SHRINK_FLOOR = 0.5


class Evidence(Protocol):
    @property
    def taken_at(self) -> float: ...

    @property
    def verified(self) -> bool: ...


E = TypeVar("E", bound=Evidence)


def shrink_problem(what: str, count: int, previous: int | None, floor: float = SHRINK_FLOOR) -> str | None:
    """Why `count` is a sharp shrink against the previous verified backup's (None: it is not)."""
    if previous is None or count >= previous * floor:
        return None
    return (f"shrank sharply: {count} {what} against {previous} in the previous verified backup "
            f"(floor {floor:.0%})")


def newest_verified(evidence: Iterable[E], name: str = "") -> E | None:
    """The newest backup whose evidence says verified (what a restore takes)."""
    good = [e for e in evidence if e.verified]
    return max(good, key=lambda e: (e.taken_at, getattr(e, name, "") if name else ""), default=None)
