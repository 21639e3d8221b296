"""Prompts for the training loop: records from the dataset registry, batched per step, resumable."""

from __future__ import annotations

import random
from typing import Any, Iterator


def load_records(dcfg) -> list[dict]:
    """Records of a DatasetConfig through areal.dataset's registry (see DatasetConfig.type)."""
    from areal.dataset.registry import load_dataset_by_name

    if dcfg.type == "files":
        records = load_dataset_by_name(dcfg.path, dcfg.split, **dcfg.kwargs)
    else:
        records = load_dataset_by_name(dcfg.type, dcfg.split, path=dcfg.path, **dcfg.kwargs)
    if dcfg.max_samples is not None:
        records = records[:dcfg.max_samples]
    if not records:
        raise ValueError(f"dataset type={dcfg.type!r} path={dcfg.path!r} split={dcfg.split!r} has no records")
    return records


class PromptLoader:
    """Batches of records, reshuffled each epoch from (seed, epoch); iterating gives one epoch.

    The position (epoch, batches handed out) is the recovery state: `load_state_dict` makes the
    next iteration continue mid-epoch where the saved run stopped.
    """

    def __init__(self, records: list[dict], batch_size: int, *, shuffle: bool = True, seed: int = 0):
        if len(records) < batch_size:
            raise ValueError(f"{len(records)} records are fewer than one batch of {batch_size} "
                             "(train_dataset.batch_size)")
        self.records, self.batch_size, self.shuffle, self.seed = records, batch_size, shuffle, seed
        self.epoch, self.position = 0, 0
        self._started = False

    def __len__(self) -> int:
        return len(self.records) // self.batch_size  # the last partial batch is dropped

    def __iter__(self) -> Iterator[list[dict[str, Any]]]:
        if self._started and self.position >= len(self):
            self.epoch, self.position = self.epoch + 1, 0
        self._started = True
        order = list(range(len(self.records)))
        if self.shuffle:
            random.Random(self.seed * 100003 + self.epoch).shuffle(order)
        while self.position < len(self):
            lo = self.position * self.batch_size
            self.position += 1
            yield [self.records[i] for i in order[lo:lo + self.batch_size]]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._started = False
