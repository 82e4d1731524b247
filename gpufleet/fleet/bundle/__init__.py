"""Diagnostic bundles (issue 16): when a fault is detected, before remediation touches the node, one
tar.gz of what an engineer or a vendor asks for, with a manifest (name, size, sha256, collector,
command, exit status, duration, truncation), bounded in time and size (docs/diagnostic-bundles.md).

No re-exports here: `python -m gpufleet.fleet.bundle`, which the node-health check runs before a
drain, imports this package first and pays for every import before the drain. Import from the
modules: `archive` (write, verify, read_manifest), `service` (collect_sandbox, collect_real),
`model` (Manifest), `caps` (the defaults and their reasons)."""
