from gpufleet.fleet.bundle.hook import run

raise SystemExit(run())
