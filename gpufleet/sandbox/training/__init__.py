"""The sandbox training workload: PyTorch DDP over gloo with fenced, checksummed checkpoints."""
