"""Fleet operations: inspection and rolling upgrades (issue 16)."""
