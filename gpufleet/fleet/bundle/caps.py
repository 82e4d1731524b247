"""Default bounds of a bundle, and why each number is what it is.

None of these numbers is published by a vendor; each is our choice, sized against what it must hold
and what it must not delay:
- collector_bytes 16 MiB: the largest single output we expect is nvidia-bug-report.log.gz, which on an
  8-GPU node is a few MiB compressed; a log tail beyond 16 MiB is noise to a reader.
- total_bytes 64 MiB: four full-size members; a bundle per fault must stay cheap to keep and to attach.
- Sandbox: every collector reads a local file, a unix socket or loopback Prometheus, each in well
  under a second on an idle machine; 3 s per collector and a 6 s deadline keep the node-health check's
  drain within the bound it states (docs/diagnostic-bundles.md) even on a loaded 2-core machine.
- Real nodes: `dcgmi diag -r 1` runs in seconds and nvidia-bug-report.sh in about a minute (the DCGM
  user guide's run levels; the driver README's bug-report section), so 120 s per collector and a
  180 s deadline. A site that cannot hold remediation that long passes smaller ones.
"""

from __future__ import annotations

from gpufleet.fleet.bundle.model import Caps

MIB = 1024 * 1024

SANDBOX_CAPS = Caps(collector_timeout_s=3.0, collector_bytes=16 * MIB, total_bytes=64 * MIB, deadline_s=6.0)
REAL_NODE_CAPS = Caps(collector_timeout_s=120.0, collector_bytes=16 * MIB, total_bytes=64 * MIB,
                      deadline_s=180.0)
