"""gpufleet: declare GPU training clusters as code and prove their recovery targets with chaos."""

__version__ = "0.1.0"
