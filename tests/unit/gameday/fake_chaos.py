"""A test double for the `chaos` CLI: replays a recorded journal instead of running an experiment.

It records its argv (to assert the game-day passes --rollback-strategy=always). With
FAKE_CHAOS_MODE=hang the shell wrapper (conftest.py) traps SIGUSR1 (chaostoolkit's "stop and play
rollbacks") from its first milliseconds and then runs this script in mode "interrupted", which
writes an interrupted journal, as the real CLI does.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "journals"


def main(argv: list[str]) -> int:
    with Path(os.environ["FAKE_CHAOS_ARGV"]).open("a") as fh:
        fh.write(json.dumps(argv) + "\n")
    # Where the extension will look for stack files (gpufleet.chaos.settings.stacks_dir_of).
    with Path(os.environ["FAKE_CHAOS_ARGV"] + ".stacks_dir").open("a") as fh:
        fh.write(os.environ.get("GPUFLEET_STACKS_DIR", "") + "\n")
    journal_path = Path(argv[argv.index("--journal-path") + 1])
    experiment = Path(argv[-1])
    mode = os.environ.get("FAKE_CHAOS_MODE", "replay")
    if mode == "interrupted":
        journal = json.loads((FIXTURES / f"{experiment.stem}.json").read_text())
        journal["status"] = "interrupted"
        journal["run"] = journal["run"][:1]
        journal_path.write_text(json.dumps(journal))
        return 1
    if mode == "no-journal":
        return 1
    journal_path.write_text((FIXTURES / f"{experiment.stem}.json").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
