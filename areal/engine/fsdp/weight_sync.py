"""Weight updates from the trainer to inference servers, over SGLang's HTTP routes.

Three ways, chosen by actor.weight_update; each hands its weights to the WeightUpdate that the
server control opened (areal/engine/sglang/control.py), which pauses the servers before and
flushes and continues them after:

disk         rank 0 writes a Hugging Face folder to
             {fileroot}/{experiment}/{trial}/weight_update/v{version} and every server loads it
             (POST /update_weights_from_disk {model_path, weight_version}); then the folders
             older than the previous version are deleted (a full model copy per step filled the
             disk on long runs; the previous one stays for a server that restarts meanwhile).
distributed  trainer rank 0 and the servers form one process group (trainer = rank 0, server i
             takes ranks rank_offset .. rank_offset + tp - 1), joined through
             POST /init_weights_update_group; then, bucket by bucket, the servers are told which
             tensors come (POST /update_weights_from_distributed {names, dtypes, shapes, ...}) while
             rank 0 broadcasts the full (unsharded) tensors in that order.
tensor       servers on the trainer's own device (colocated): rank 0 gathers full tensors
             bucket by bucket and the servers copy them through CUDA IPC handles (shared memory
             on CPU) (POST /update_weights_from_tensor).

This module knows the process-group rendezvous and the buckets; the engine decides what to send,
and the server client (areal/engine/sglang/control.py) speaks to the servers.
"""

from __future__ import annotations

import logging
import re
import shutil
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, Future, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, TypeVar

import torch

from areal.api.inference import WeightUpdateMeta
from areal.infra.ports import free_port
from areal.utils.dist_group import init_custom_process_group

logger = logging.getLogger("areal.weight_sync")

# How long trainer rank 0 waits for every server to join the weight-update group.
JOIN_TIMEOUT_S = 120.0


def disk_update_path(fileroot: str, experiment: str, trial: str, version: int) -> str:
    """Where disk weight updates of one version are written (servers read it from there)."""
    return f"{fileroot}/{experiment}/{trial}/weight_update/v{version}"


KEEP_DISK_UPDATES = 2  # the version just loaded and the one before it


def prune_disk_updates(folder: str | Path, newest: int, keep: int = KEEP_DISK_UPDATES) -> list[Path]:
    """Delete the `v{k}` folders in `folder` (weight_update/) with k <= newest - keep.

    The previous version stays: served_weights.json may still name it while a restarted server
    reads it (it is rewritten after the update returns). Returns the deleted folders; a folder
    that cannot be deleted is logged and left.
    """
    deleted = []
    for path in sorted(Path(folder).glob("v*")):
        match = re.fullmatch(r"v(\d+)", path.name)
        if not (match and path.is_dir() and int(match.group(1)) <= newest - keep):
            continue
        try:
            shutil.rmtree(path)
            deleted.append(path)
        except OSError as e:
            logger.warning("could not delete the old weight update %s: %s", path, e)
    return deleted


@dataclass
class UpdateStats:
    """What one weight update cost; logged and returned to the training loop.

    phases: seconds per phase on trainer rank 0 (see PhaseTimer), e.g. gather (full tensors
    out of the shards, cast), transfer (disk: writing the folder; distributed: the broadcasts and
    per-bucket notices, up to the servers' answers), load (disk: waiting for the servers to load
    the folder), server_load (what the slowest server reported for applying the weights).
    """

    seconds: float
    bytes: int
    version: int
    kind: str
    phases: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, float]:
        out = {
            "weight_update/seconds": self.seconds,
            "weight_update/bytes": float(self.bytes),
            "weight_update/version": float(self.version),
        }
        out.update({f"weight_update/{name}_s": s for name, s in self.phases.items()})
        return out


T = TypeVar("T")


class PhaseTimer:
    """Seconds per named phase of one weight update, summed over its buckets.

    sync (torch.cuda.synchronize on GPU) runs at the end of each phase, so asynchronous kernels
    are charged to the phase that launched them; it runs once per bucket or file, not per tensor.
    """

    def __init__(self, sync: Callable[[], None] | None = None):
        self.seconds: dict[str, float] = {}
        self._sync = sync

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    @contextmanager
    def phase(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self._sync is not None:
                self._sync()
            self.add(name, time.perf_counter() - t0)

    def iterate(self, name: str, items: Iterable[T]) -> Iterator[T]:
        """Yield from items, charging the time spent producing each item to `name`."""
        it = iter(items)
        while True:
            with self.phase(name):
                try:
                    item = next(it)
                except StopIteration:
                    return
            yield item

    def add_server_seconds(self, name: str, replies: list[dict], key: str = "load_s") -> None:
        """Add the slowest server's reported seconds (servers that report none count 0)."""
        values = [float(r[key]) for r in replies if isinstance(r.get(key), (int, float))]
        if values:
            self.add(name, max(values))


class DistributedSender:
    """Trainer rank 0's side of the distributed update: the group and the bucketed broadcast.

    `servers` is the ServerControl whose servers join the group; each bucket is announced through
    the open WeightUpdate. This class only joins the group and broadcasts."""

    def __init__(
        self, servers, *, backend: str, group_name: str, master_address: str, master_port: int, device: str = "cpu"
    ):
        self.servers, self.group_name, self.device = servers, group_name, device
        world_size = servers.group_world_size
        master_port = master_port or free_port(master_address)
        meta = WeightUpdateMeta(
            type="distributed",
            master_address=master_address,
            master_port=master_port,
            group_name=group_name,
            backend=backend,
        )
        # Servers block in the rendezvous until rank 0 joins, so their requests run meanwhile;
        # rank 0 joins in a thread so that a server refusing the request fails fast instead of
        # leaving us in the rendezvous until its timeout.
        pending = servers.init_weights_update_group(meta)
        joined: Future = Future()

        def join() -> None:
            try:
                joined.set_result(
                    init_custom_process_group(
                        timeout_s=servers.weight_timeout_s,
                        backend=backend,
                        master_address=master_address,
                        master_port=master_port,
                        world_size=world_size,
                        rank=0,
                        group_name=group_name,
                    )
                )
            except BaseException as exc:  # handed to the waiting thread below
                joined.set_exception(exc)

        threading.Thread(target=join, daemon=True, name="weight-update-join").start()
        done, _ = wait([joined, pending], timeout=JOIN_TIMEOUT_S, return_when=FIRST_EXCEPTION)
        for f in done:
            f.result()  # raises the first failure (e.g. a server refusing the request)
        if not joined.done():
            raise TimeoutError(
                f"the servers did not join weight update group {group_name!r} at "
                f"{master_address}:{master_port} within {JOIN_TIMEOUT_S:.0f} s; they must build the "
                "group like SGLang (TCPStore wrapped in PrefixStore(group_name)) and reach that address"
            )
        self.group = joined.result()
        pending.result(timeout=JOIN_TIMEOUT_S)
        logger.info("weight update group %r ready: world %d", group_name, world_size)

    def send_bucket(self, update, bucket: list[tuple[str, torch.Tensor]]) -> list[dict]:
        """Announce the bucket through `update` (the open WeightUpdate), then broadcast its tensors
        in the same order; returns the servers' replies (after they applied the bucket)."""
        import torch.distributed as dist

        meta = WeightUpdateMeta(
            type="distributed",
            group_name=self.group_name,
            names=[n for n, _ in bucket],
            dtypes=[str(t.dtype).removeprefix("torch.") for _, t in bucket],
            shapes=[list(t.shape) for _, t in bucket],
        )
        pending = update.load_broadcast(meta)
        for _, tensor in bucket:
            dist.broadcast(tensor.to(self.device).contiguous(), src=0, group=self.group)
        return pending.result(timeout=self.servers.weight_timeout_s)

    def destroy(self, timeout_s: float = 60.0) -> None:
        """Tear the group down on both sides at once (a side waiting for the other to finish its
        destroy first could deadlock); server errors are logged, not raised."""
        import torch.distributed as dist

        pending = self.servers.destroy_weights_update_group(
            WeightUpdateMeta(type="distributed", group_name=self.group_name)
        )
        dist.destroy_process_group(self.group)
        try:
            pending.result(timeout=timeout_s)
        except Exception as exc:
            logger.warning("a server did not destroy weight update group %r: %s", self.group_name, exc)


def buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor | None]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor | None]]]:
    """Group (name, tensor) pairs into lists of about bucket_bytes (a big tensor is its own bucket).

    Non-zero ranks pass tensor=None (they only take part in the gathers), so they count 0 bytes;
    the bucket boundaries only matter on rank 0.
    """
    bucket, size = [], 0
    for name, tensor in named_tensors:
        nbytes = tensor.numel() * tensor.element_size() if tensor is not None else 0
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket
