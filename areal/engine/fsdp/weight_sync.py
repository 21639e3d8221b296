"""What the trainer engine needs to push weights to inference servers: the disk update folders,
the buckets full tensors travel in, and the figures of one update.

Three ways, chosen by actor.weight_update; the engine pushes into the WeightSink that the servers'
control opened (areal/api/weights.py), which pauses the servers before and flushes and continues
them after:

disk         rank 0 writes a Hugging Face folder to
             {fileroot}/{experiment}/{trial}/weight_update/v{version} and every server loads it;
             then the folders older than the previous version are deleted (a full model copy per
             step filled the disk on long runs; the previous one stays for a server that restarts
             meanwhile).
distributed  rank 0 gathers full tensors bucket by bucket and the sink broadcasts each bucket to
             the servers over the process group it owns (areal/engine/sglang/broadcast.py).
tensor       servers on the trainer's own device (colocated): rank 0 gathers full tensors
             bucket by bucket and the servers copy them through CUDA IPC handles (shared memory
             on CPU).

This module never speaks to a server.
"""

from __future__ import annotations

import logging
import re
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, TypeVar

import torch

logger = logging.getLogger("areal.weight_sync")


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
    the folder). What the servers report for applying the weights is the sink's (server_load_s).
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
