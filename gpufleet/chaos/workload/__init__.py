"""The training workload: rank faults, progress, and the recovery timeline and verdict."""
