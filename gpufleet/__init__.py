"""gpufleet: declare GPU training clusters as code and prove their recovery targets with chaos."""

__version__ = "0.1.0"


def discover(discover_system: bool = True) -> object:
    """Chaos Toolkit discovery (`chaos discover gpufleet` looks for it on the top-level package);
    imported lazily so `import gpufleet` stays light."""
    from gpufleet.chaos import discover as chaos_discover

    return chaos_discover(discover_system)
