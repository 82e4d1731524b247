"""The backends by name, with what each declares it can inject (read without connecting to any)."""

from __future__ import annotations

from gpufleet.catalog.injection import InjectionModel
from gpufleet.chaos.backends.base import Backend
from gpufleet.chaos.backends.kubernetes import KubernetesBackend
from gpufleet.chaos.backends.sandbox import SandboxBackend
from gpufleet.chaos.backends.slurm import SlurmBackend
from gpufleet.chaos.backends.storage import StorageBackend

BACKEND_CLASSES: dict[str, type[Backend]] = {
    "sandbox": SandboxBackend,
    "slurm": SlurmBackend,
    "kubernetes": KubernetesBackend,
    "storage": StorageBackend,
}


def backend_class(name: str) -> type[Backend]:
    try:
        return BACKEND_CLASSES[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; known: {', '.join(BACKEND_CLASSES)}") from None


def capabilities() -> dict[str, frozenset[type[InjectionModel]]]:
    """Backend name -> the injection models it can plan (e.g. for the generated runbooks)."""
    return {name: cls.capabilities for name, cls in BACKEND_CLASSES.items()}
