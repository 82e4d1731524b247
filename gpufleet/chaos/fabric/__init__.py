"""Fabric (InfiniBand / RoCE rail) link faults."""
