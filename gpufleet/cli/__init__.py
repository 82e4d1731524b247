"""The `gpufleet` command line: one typer app over every domain."""
