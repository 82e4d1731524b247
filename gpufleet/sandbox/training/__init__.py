"""The sandbox training workload: data-parallel PyTorch (all-reduce over gloo) with fenced, checksummed
checkpoints."""
