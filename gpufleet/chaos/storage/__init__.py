"""Storage faults (the checkpoint store)."""
