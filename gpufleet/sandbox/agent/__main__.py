"""`python -m gpufleet.sandbox.agent`."""

from gpufleet.sandbox.agent.cli import main

raise SystemExit(main())
