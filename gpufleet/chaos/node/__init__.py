"""Node faults (crash, hang, reboot) and isolation primitives (cordon, taint, evict)."""
