"""Prompts for the training loop: records from the dataset registry, batched per step, resumable."""

from __future__ import annotations

import logging
import random
from typing import Any, Iterator

logger = logging.getLogger("areal.trainer")


def load_records(dcfg, *, key: str = "train_dataset", tokenizer=None, system_prompt: str | None = None) -> list[dict]:
    """Records of a DatasetConfig through areal.dataset's registry (see DatasetConfig.type).

    With `max_prompt_len` set, records whose chat prompt (chat template and `system_prompt`, as
    the workflows build it) is longer are dropped; `tokenizer` (an object or a path) is then
    required. `key` names the config section in messages.
    """
    from areal.dataset.registry import load_dataset_by_name

    if dcfg.type == "files":
        records = load_dataset_by_name(dcfg.path, dcfg.split, **dcfg.kwargs)
    else:
        records = load_dataset_by_name(dcfg.type, dcfg.split, path=dcfg.path, **dcfg.kwargs)
    if dcfg.max_samples is not None:
        records = records[: dcfg.max_samples]
    if not records:
        raise ValueError(f"dataset type={dcfg.type!r} path={dcfg.path!r} split={dcfg.split!r} has no records")
    if dcfg.max_prompt_len is not None:
        records = drop_long_prompts(records, dcfg.max_prompt_len, tokenizer, system_prompt, key=f"{key}.max_prompt_len")
    return records


def drop_long_prompts(
    records: list[dict],
    max_len: int,
    tokenizer,
    system_prompt: str | None = None,
    *,
    key: str = "train_dataset.max_prompt_len",
) -> list[dict]:
    """The records whose chat prompt has at most `max_len` tokens; raises if none has."""
    from areal.workflow.common import chat_prompt_ids, load_tokenizer, record_messages

    if tokenizer is None:
        raise ValueError(f"{key}={max_len} needs a tokenizer to measure prompts; set actor.tokenizer_path")
    tokenizer = load_tokenizer(tokenizer)
    lengths = [len(chat_prompt_ids(tokenizer, record_messages(r, system_prompt))) for r in records]
    kept = [r for r, n in zip(records, lengths) if n <= max_len]
    if not kept:
        raise ValueError(
            f"{key}={max_len}: all {len(records)} prompts are longer (the shortest has "
            f"{min(lengths)} tokens with the chat template); raise it, or set it to null "
            "to keep every prompt"
        )
    if len(kept) < len(records):
        logger.info(
            "%s=%d: dropped %d of %d prompts (longest %d tokens)",
            key,
            max_len,
            len(records) - len(kept),
            len(records),
            max(lengths),
        )
    return kept


class PromptLoader:
    """Batches of records, reshuffled each epoch from (seed, epoch); iterating gives one epoch.

    The position (epoch, batches handed out) is the recovery state: `load_state_dict` makes the
    next iteration continue mid-epoch where the saved run stopped. A state may also hold
    `offset`: the first batch then starts at that record of batch `position` (the rollout
    executor's resume point, which can fall inside a batch).
    """

    def __init__(self, records: list[dict], batch_size: int, *, shuffle: bool = True, seed: int = 0):
        if len(records) < batch_size:
            raise ValueError(
                f"{len(records)} records are fewer than one batch of {batch_size} (train_dataset.batch_size)"
            )
        self.records, self.batch_size, self.shuffle, self.seed = records, batch_size, shuffle, seed
        self.epoch, self.position, self.offset = 0, 0, 0
        self.last_batch_offset = 0
        self._started = False
        self._ids = {id(r): i for i, r in enumerate(records)}

    def record_id(self, record: dict) -> int | None:
        """A record's stable id: its index in the dataset (the same in every run of the same data
        config, whatever the shuffle), or None for a record that is not one of this loader's."""
        return self._ids.get(id(record))

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
            skip, self.offset = self.offset, 0
            self.position += 1
            self.last_batch_offset = skip  # the yielded batch's first record, within its batch
            yield [self.records[i] for i in order[lo + skip : lo + self.batch_size]]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self.offset = int(state.get("offset", 0))
        if not 0 <= self.offset < self.batch_size:
            raise ValueError(f"loader state offset {self.offset} is outside a batch of {self.batch_size}")
        self._started = False
