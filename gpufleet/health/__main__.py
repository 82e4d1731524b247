"""`python -m gpufleet.health`: the node-health check without the CLI framework (fast start)."""

from gpufleet.health.cli import main

main()
