"""Data-parallel SGD with momentum for the sandbox training rank, on torch.distributed collectives.

It does what DistributedDataParallel and torch.optim.SGD did for this job: rank 0's parameters are
broadcast at start, gradients are averaged with one all-reduce per step (one bucket: the model is
~8,500 parameters), and the update is SGD with momentum as torch.optim.SGD defines it (no dampening,
no Nesterov, no weight decay: buf = momentum * buf + grad; p -= lr * buf; the first buf is the grad).

Why not DDP and torch.optim: both import torch._dynamo on first use (DDP's constructor asks it for
the optimize-ddp mode; every Optimizer.step imports it), 1.8-2.9 s of CPU per rank on these 2-core
machines. Two ranks starting at once reached their first step in 4.0-4.9 s with DDP + SGD and in
2.2-2.4 s with this (3 runs each, measured 2026-12-04); every training restart of a game-day paid
the difference. The collectives, the gloo transport and its timeouts are the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist


class DataParallelSGD:
    def __init__(self, params: Sequence[torch.nn.Parameter], lr: float, momentum: float) -> None:
        self.params = list(params)
        self.lr, self.momentum = lr, momentum
        self.buffers: list[torch.Tensor] | None = None  # created by the first step, as torch.optim.SGD

    def broadcast_parameters(self) -> None:
        """Every rank starts from rank 0's parameters (and so from its checkpoint, or its seed)."""
        with torch.no_grad():
            for p in self.params:
                dist.broadcast(p.data, src=0)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        """Average the gradients over every rank (one all-reduce: a lost peer fails it after the
        process group's timeout), then apply the momentum update."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        with torch.no_grad():
            if self.buffers is None:
                self.buffers = [torch.zeros_like(p) for p in self.params]
            offset = 0
            for p, buf in zip(self.params, self.buffers, strict=True):
                g = flat[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
                buf.mul_(self.momentum).add_(g)
                p.add_(buf, alpha=-self.lr)

    def state_dict(self) -> dict[str, Any]:
        return {"lr": self.lr, "momentum": self.momentum,
                "momentum_buffers": None if self.buffers is None else [b.clone() for b in self.buffers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        bufs = state["momentum_buffers"]
        if bufs is not None and [tuple(b.shape) for b in bufs] != [tuple(p.shape) for p in self.params]:
            raise ValueError("checkpoint's momentum buffers do not match the model's parameters")
        self.lr, self.momentum = float(state["lr"]), float(state["momentum"])
        self.buffers = None if bufs is None else [b.clone() for b in bufs]
