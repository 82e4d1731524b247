"""GPU faults (catalog XIDs and DCGM field injections)."""
