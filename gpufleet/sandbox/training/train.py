"""`python -m gpufleet.sandbox.training.train`: one rank of the sandbox training job.

Data-parallel PyTorch over gloo on the node's fabric interface (dataparallel.py), a small deterministic
model on seeded synthetic data, fenced checksummed checkpoints (checkpoint.py), progress exported
to Prometheus from rank 0. Launched by `srun` from the job script (jobscript.py); the rank's place
comes from the Slurm task environment (slurmenv.py).
"""

from __future__ import annotations

import argparse
import errno
import io
import json
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from gpufleet.core.sandbox_contract import AGENT_HEALTH_FILE
from gpufleet.sandbox.gpu_health import GpuHealth
from gpufleet.sandbox.training.checkpoint import CkptKey, StaleGeneration, open_store
from gpufleet.sandbox.training.progress import (
    EventContext,
    EventLog,
    TrainingCollector,
    TrainingProgress,
    write_file_sd,
)
from gpufleet.sandbox.training.slurmenv import RankInfo, rank_info

IN_FEATURES, HIDDEN = 64, 128
STORE_TIMEOUT_S = 60.0  # rendezvous waits for ranks still importing torch (~2 s each on 2 cores)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gpufleet.sandbox.training.train", description=__doc__)
    p.add_argument("--base-dir", type=Path, required=True)
    p.add_argument("--checkpoint-dir", type=Path, required=True)
    p.add_argument("--checkpoint-s3", type=Path, default=None,
                   help="the job's S3 location file (core.s3_job_checkpoints.S3Location): checkpoints "
                   "go to that bucket prefix instead of --checkpoint-dir")
    p.add_argument("--events-file", type=Path, required=True)
    p.add_argument("--file-sd-dir", type=Path, required=True)
    p.add_argument("--hosts-file", type=Path, required=True)
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--step-sleep", type=float, default=0.05)
    p.add_argument("--max-steps", type=int, default=1_000_000)
    p.add_argument("--pg-timeout", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--keep-checkpoints", type=int, default=3)
    p.add_argument("--rendezvous-port", type=int, default=29500)
    p.add_argument("--metrics-port", type=int, default=9410,
                   help="rank 0's Prometheus port on the node's management address; 0: none (smoke.py)")
    p.add_argument("--job-name", default=os.environ.get("SLURM_JOB_NAME", "train"))
    return p


def _error_code(e: Exception) -> str:
    """errno's name for an OSError, S3's error code for a ClientError, the class otherwise."""
    if isinstance(e, OSError):
        return errno.errorcode.get(e.errno or 0, "?")
    if isinstance(e, ClientError):
        return str(e.response.get("Error", {}).get("Code", "?"))
    return type(e).__name__


def rendezvous_port(base: int, restart: int) -> int:
    """A fresh port per incarnation, so a requeued job never meets a socket of its old self."""
    return base + restart % 100


def read_hosts(path: Path) -> dict[str, dict[str, str]]:
    doc = json.loads(path.read_text())
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected an object node -> {{mgmt_ip, fabric_ip, fabric_ifname}}")
    for node, entry in doc.items():
        missing = {"mgmt_ip", "fabric_ip", "fabric_ifname"} - set(entry)
        if missing:
            raise ValueError(f"{path}: node {node} lacks {', '.join(sorted(missing))}")
    return doc


class Trainer:
    def __init__(
        self, args: argparse.Namespace, info: RankInfo, hosts: dict[str, dict[str, str]], events: EventLog
    ) -> None:
        import torch

        self.args, self.info, self.hosts, self.events = args, info, hosts, events
        self.torch = torch
        self.gen = (info.job_id, info.restart)
        self.ckpt = open_store(args.checkpoint_dir, args.checkpoint_s3)
        node_dir = args.base_dir / "nodes" / info.node
        # Faults that kill only the running process (XID 94) apply to processes started before them.
        self.health = GpuHealth(node_dir / AGENT_HEALTH_FILE, info.gpus or (info.local_rank,),
                                started_at=time.time())
        self.proc_files = [node_dir / "procs" / f"gpu{g}.json" for g in info.gpus or (info.local_rank,)]
        self.progress = TrainingProgress(info.job_id, args.job_name, info.world_size, info.restart)
        self.step = 0

    # ------------------------------------------------------------------ setup

    def register_gpu(self) -> None:
        """Tell the node agent which process uses the GPUs it holds (busy metrics, the pid in Xid
        lines)."""
        for f in self.proc_files:
            if f.parent.parent.is_dir():
                f.parent.mkdir(exist_ok=True)
                f.write_text(json.dumps({"pid": os.getpid(), "name": "python"}))

    def unregister_gpu(self) -> None:
        for f in self.proc_files:
            try:
                doc = json.loads(f.read_text())
                if doc.get("pid") == os.getpid():
                    f.unlink()
            except (OSError, ValueError):
                pass

    def init_group(self) -> None:
        import torch.distributed as dist

        me = self.hosts[self.info.node]
        # gloo binds to the address of the hostname (127.0.0.1 here) unless told the interface.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", me["fabric_ifname"])
        master = self.hosts[self.info.master_node]["fabric_ip"]
        port = rendezvous_port(self.args.rendezvous_port, self.info.restart)
        store = dist.TCPStore(  # type: ignore[attr-defined,unused-ignore]
            master, port, self.info.world_size, is_master=self.info.rank == 0,
            timeout=timedelta(seconds=STORE_TIMEOUT_S), wait_for_workers=True,
        )
        # The process-group timeout bounds every collective: a lost peer fails the step after
        # pg_timeout seconds (the gloo analogue of the NCCL watchdog; sandbox-notes.md).
        dist.init_process_group("gloo", store=store, rank=self.info.rank, world_size=self.info.world_size,
                                timeout=timedelta(seconds=self.args.pg_timeout))

    def start_metrics(self) -> None:
        from prometheus_client import CollectorRegistry, start_http_server

        ip = self.hosts[self.info.node]["mgmt_ip"]
        registry = CollectorRegistry(auto_describe=False)
        registry.register(TrainingCollector(self.progress))
        start_http_server(self.args.metrics_port, addr=ip, registry=registry)
        write_file_sd(self.args.file_sd_dir / f"training-{self.args.job_name}.json",
                      f"{ip}:{self.args.metrics_port}",
                      {"job_name": self.args.job_name, "node": self.info.node,
                       "slurm_job_id": str(self.info.job_id)})

    # ------------------------------------------------------------------ model

    def build(self) -> None:
        torch = self.torch
        from gpufleet.sandbox.training.dataparallel import DataParallelSGD

        torch.manual_seed(self.args.seed)
        model = torch.nn.Sequential(
            torch.nn.Linear(IN_FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 1)
        )
        self.model = model
        self.opt = DataParallelSGD(list(model.parameters()), lr=0.01, momentum=0.9)
        g = torch.Generator().manual_seed(self.args.seed)
        self.w_true = torch.randn(IN_FEATURES, 1, generator=g)
        self.resume()
        self.opt.broadcast_parameters()  # every rank starts from rank 0's parameters

    def batch(self, step: int) -> tuple[Any, Any]:
        """The same batch for (seed, step, rank) in every incarnation: a resumed run repeats exactly."""
        torch = self.torch
        g = torch.Generator().manual_seed(self.args.seed * 1_000_003 + step * 1_009 + self.info.rank)
        x = torch.randn(self.args.batch_size, IN_FEATURES, generator=g)
        y = x @ self.w_true + 0.01 * torch.randn(self.args.batch_size, 1, generator=g)
        return x, y

    # ------------------------------------------------------------------ checkpoints

    def resume(self) -> None:
        import torch.distributed as dist

        choice: list[Any] = [None]
        if self.info.rank == 0:
            loaded, skipped = self.ckpt.newest_valid()
            for key, why in skipped:
                self.events.emit("error", None, message=f"skipped checkpoint {key.stem}: {why}")
            choice = [None if loaded is None else [loaded.key.job, loaded.key.restart, loaded.key.step]]
        dist.broadcast_object_list(choice, src=0)
        if choice[0] is None:
            return
        key = CkptKey(*choice[0])
        got = self.ckpt.load(key)
        if isinstance(got, str):
            raise RuntimeError(f"checkpoint {key.stem} chosen by rank 0 is invalid here: {got}")
        state = self.torch.load(io.BytesIO(got.payload), weights_only=True)
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
        self.progress.update(step=self.step, last_checkpoint_step=self.step)
        if self.info.rank == 0:
            self.events.emit("resume", self.step, checkpoint=key.stem, from_job=key.job,
                             from_restart=key.restart)

    def save(self) -> None:
        buf = io.BytesIO()
        self.torch.save({"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                         "step": self.step}, buf)
        t0 = time.monotonic()
        try:
            key = self.ckpt.write(self.gen, self.step, buf.getvalue(),
                                  {"world_size": self.info.world_size, "written_at": time.time(),
                                   "node": self.info.node})
            dt = time.monotonic() - t0
            self.ckpt.prune(self.gen, self.args.keep_checkpoints)
        except (OSError, BotoCoreError, ClientError) as e:
            # The checkpoint store failed (read-only, I/O error, full, gone; on S3: the bucket gone,
            # radosgw down or timing out): the model in memory is fine, so a failed checkpoint is
            # not a crash. Count it (the alert's signal), say so, and try again at the next
            # interval; a failure meanwhile loses more work, which is the risk the alert reports.
            # StaleGeneration (fencing) is none of these and still stops the rank.
            self.progress.update(checkpoint_failures=self.progress.checkpoint_failures + 1)
            self.events.emit("checkpoint_failed", self.step, errno=_error_code(e), message=str(e)[:300])
            return
        self.progress.update(last_checkpoint_step=self.step)
        self.events.emit("checkpoint", self.step, checkpoint=key.stem, bytes=len(buf.getvalue()),
                         write_seconds=round(dt, 4))

    # ------------------------------------------------------------------ loop

    def run(self) -> None:
        torch = self.torch
        loss_fn = torch.nn.MSELoss()
        samples = self.args.batch_size * self.info.world_size
        first = True
        rate_t, rate_n = time.monotonic(), 0
        while self.step < self.args.max_steps:
            self.health.wait_while_hung()  # a hung GPU: the step never completes, no error says why
            err = self.health.error()
            if err is not None:
                raise RuntimeError(err)
            x, y = self.batch(self.step)
            self.opt.zero_grad()
            loss = loss_fn(self.model(x), y)
            loss.backward()
            self.opt.step()  # all-reduces the gradients over gloo, then updates
            self.step += 1
            rate_n += 1
            now = time.monotonic()
            if now - rate_t >= 1.0:
                self.progress.update(samples_per_second=rate_n * samples / (now - rate_t))
                rate_t, rate_n = now, 0
            self.progress.update(step=self.step)
            if self.info.rank == 0:
                # The first step after a (re)start is always recorded: it dates the recovery.
                self.events.step(self.step, force=first, loss=round(float(loss.detach()), 6))
                first = False
                if self.step % self.args.checkpoint_every == 0:
                    self.save()
            if self.args.step_sleep > 0:
                time.sleep(self.args.step_sleep)
        self.final_loss = float(loss_fn(self.model(self.batch(0)[0]), self.batch(0)[1]).detach())


def _install_signal_handlers(events: EventLog, trainer: list[Trainer]) -> None:
    def handler(signum: int, _frame: FrameType | None) -> None:
        step = trainer[0].step if trainer else None
        events.emit("exit", step, reason=f"signal {signal.Signals(signum).name}")
        if trainer:
            trainer[0].unregister_gpu()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        info = rank_info(os.environ)
        hosts = read_hosts(args.hosts_file)
        for n in (info.node, info.master_node):
            if n not in hosts:
                raise ValueError(f"{args.hosts_file}: no entry for node {n}")
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    events = EventLog(args.events_file, EventContext(info.job_id, info.restart, info.node, info.rank))
    holder: list[Trainer] = []
    _install_signal_handlers(events, holder)
    events.emit("start", None, world_size=info.world_size, host=socket.gethostname(), pid=os.getpid())
    try:
        import torch

        torch.set_num_threads(1)  # a sandbox node shares 2 cores with every other node
        trainer = Trainer(args, info, hosts, events)
        holder.append(trainer)
        trainer.register_gpu()
        if info.rank == 0:
            trainer.ckpt.claim(trainer.gen)  # fence every older incarnation before anything else
        trainer.init_group()
        if info.rank == 0 and args.metrics_port:
            trainer.start_metrics()
        trainer.build()
        trainer.run()
    except StaleGeneration as e:
        events.emit("exit", holder[0].step if holder else None, reason=f"fenced: {e}")
        print(f"fenced: {e}", file=sys.stderr)
        return 3
    except Exception as e:
        events.emit("error", holder[0].step if holder else None, message=f"{type(e).__name__}: {e}")
        traceback.print_exc()
        print(f"rank {info.rank} on {info.node} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        if holder:
            holder[0].unregister_gpu()
    events.emit("exit", trainer.step, reason="finished", final_loss=round(trainer.final_loss, 6))
    import torch.distributed as dist

    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    rc = main()
    if rc != 0:
        # A rank that failed has not torn its process group down (a peer may still be in a
        # collective), so gloo's threads still run; the interpreter's teardown then destroys a
        # joinable std::thread and the C++ runtime aborts ("terminate called without an active
        # exception": exit -6 instead of 1, seen in the unit tier under load). Its events are single
        # appended writes and its GPUs are released, so it leaves without the teardown.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    raise SystemExit(rc)
