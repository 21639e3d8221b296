"""Micro-batch token budgets: fixed (actor.max_tokens_per_mb=N) or sized from free device memory (=auto).

With "auto" on CUDA the engine measures instead of guessing, per pass kind ("forward": the
forward-only logprob recompute; "train": forward and backward), because the two differ a lot:

- the first pass of a kind runs at AUTO_PROBE_TOKENS, in at least two micro-batches when it has
  two sequences (so gradient accumulation across micro-batches is part of what it measures);
- a measured pass records the peak memory it added above what was allocated when it started,
  divided by the real tokens of its largest micro-batch: bytes per token;
- every pass gets `budget_from_memory`: the memory free for it (`usable_bytes`: the device's free
  memory plus what the caching allocator holds unused, less the fragments of its blocks split around
  live tensors; beside colocated servers that keep their memory, free memory only up to the
  trainer's share, areal.config.experiment.trainer_memory_share) x (1 - actor.mb_memory_headroom) /
  bytes per token, rounded down to a multiple of 1024, never below the longest sequence of the batch.

The fixed memory a pass adds (gradients) is charged to the tokens of the measured micro-batch, so
the line through zero and the measurement lies above the true cost for any larger budget: a
budget above the measured micro-batch errs on the safe side. A pass is measured again only when
its largest micro-batch is larger than the measured one (the estimate then gets tighter), so
after a few steps nothing is measured any more; each measurement resets the device's peak-memory
statistics (torch.cuda.reset_peak_memory_stats). Free memory is read at the start of every pass,
so a budget follows what others (a colocated server) take. A CUDA out-of-memory error in a pass
becomes `AutoBudgetOutOfMemory`, which names the setting and what to set instead; nothing is
retried. A measured budget that cuts a pass into CRAMPED_MICROBATCHES or more is logged once per
pass kind, with what frees memory. Without device memory to measure (CPU), "auto" is the fixed
AUTO_CPU_TOKENS.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import torch

from areal.config.actor import AUTO_CPU_TOKENS, AUTO_PROBE_TOKENS, CRAMPED_MICROBATCHES

GRANULE = 1024  # budgets are multiples of this many tokens

logger = logging.getLogger("areal.fsdp")


def budget_from_memory(
    free_bytes: float, bytes_per_token: float, headroom: float, longest: int, granule: int = GRANULE
) -> int:
    """Tokens of one micro-batch: free_bytes x (1 - headroom) / bytes_per_token, rounded down to
    a multiple of `granule`, and never below `longest` (a sequence is never split)."""
    if bytes_per_token <= 0:
        raise ValueError(f"bytes_per_token must be > 0, got {bytes_per_token}")
    usable = max(free_bytes, 0) * (1.0 - headroom)
    tokens = int(usable // bytes_per_token) // granule * granule
    return max(tokens, int(longest))


def usable_bytes(device_free: int, reserved: int, allocated: int, inactive_split: int, limit: int | None = None) -> int:
    """Memory a pass can take: the device's free memory plus the caching allocator's reserved but
    unallocated memory, less its inactive split blocks (free fragments of segments that also hold
    live tensors). A pass's large tensors (the [tokens, vocab] logits) cannot use those fragments,
    and the allocator cannot hand them back to the device: on one H100 a budget that counted them
    ran out of memory with 8.6 GiB of them reserved. `limit`: the most this process may reserve
    (its share beside colocated servers); free memory past it is theirs."""
    cached_whole = max(reserved - allocated - inactive_split, 0)
    if limit is not None:
        device_free = min(device_free, max(limit - reserved, 0))
    return int(device_free + cached_whole)


class DeviceMemory(Protocol):
    """The readings the auto budget needs (CudaMemory; tests pass a fake)."""

    def free_bytes(self) -> int: ...

    def allocated(self) -> int: ...

    def reset_peak(self) -> None: ...

    def peak(self) -> int: ...


class CudaMemory:
    """The current CUDA device, as the caching allocator sees it (host-side figures: no sync).
    `share`: the fraction of the device this process may count on (None: all of it)."""

    def __init__(self, share: float | None = None):
        self.share = share

    def free_bytes(self) -> int:
        free, total = torch.cuda.mem_get_info()
        stats = torch.cuda.memory_stats()
        return usable_bytes(
            free,
            stats.get("reserved_bytes.all.current", 0),
            stats.get("allocated_bytes.all.current", 0),
            stats.get("inactive_split_bytes.all.current", 0),
            limit=None if self.share is None else int(total * self.share),
        )

    def allocated(self) -> int:
        return int(torch.cuda.memory_allocated())

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats()

    def peak(self) -> int:
        return int(torch.cuda.max_memory_allocated())


@dataclass(frozen=True)
class Measurement:
    tokens: int  # real tokens of the largest micro-batch of the measured pass
    added_bytes: int  # the pass's peak allocation minus what was allocated when it started

    @property
    def bytes_per_token(self) -> float:
        return max(self.added_bytes, 1) / self.tokens


class AutoBudgetOutOfMemory(torch.OutOfMemoryError):
    """CUDA ran out of memory in a pass whose budget actor.max_tokens_per_mb=auto chose."""


class TokenBudget:
    """The token budget of each pass kind for one engine: `plan` before packing a pass, `measure`
    around running it. `setting` is actor.max_tokens_per_mb; `memory` None means nothing to
    measure (CPU), where "auto" is AUTO_CPU_TOKENS. `checkpointing`: whether the model recomputes
    its activations in the backward pass (actor.gradient_checkpointing); a cramped train budget's
    report suggests it where it is off."""

    def __init__(
        self, setting: int | str, headroom: float, memory: DeviceMemory | None = None, checkpointing: bool = True
    ):
        self.setting, self.headroom, self.memory = setting, headroom, memory
        self.checkpointing = checkpointing
        self.estimates: dict[str, Measurement] = {}
        self.used: dict[str, int] = {}  # the budget of the latest pass of each kind
        self.cramped: dict[str, int] = {}  # pass kind -> the micro-batch count it was reported at

    @property
    def measured(self) -> bool:
        return self.setting == "auto" and self.memory is not None

    def plan(self, kind: str, lengths: list[int]) -> tuple[int, int]:
        """(token budget, least micro-batch count) for a pass of `kind` over sequences of `lengths`."""
        longest = max(lengths, default=1)
        min_count = 1
        if not self.measured:
            budget = AUTO_CPU_TOKENS if self.setting == "auto" else int(self.setting)
        elif kind not in self.estimates:  # the probe
            budget = max(AUTO_PROBE_TOKENS, longest)
            min_count = 2 if len(lengths) >= 2 else 1
        else:
            bpt = self.estimates[kind].bytes_per_token
            free = self.memory.free_bytes()
            budget = budget_from_memory(free, bpt, self.headroom, longest)
            self._report_cramped(kind, budget, sum(lengths), free, bpt)
        self.used[kind] = budget
        return budget, min_count

    def _report_cramped(self, kind: str, budget: int, total: int, free: int, bytes_per_token: float) -> None:
        """Warn once per pass kind when the measured budget cuts a pass into CRAMPED_MICROBATCHES
        or more micro-batches: many small ones run far slower than a few large ones."""
        count = -(-total // budget)
        if count < CRAMPED_MICROBATCHES or kind in self.cramped:
            return
        self.cramped[kind] = count
        ways = ["leave the trainer more memory (beside colocated servers: a smaller sglang.mem_fraction_static)"]
        if kind == "train" and not self.checkpointing:
            ways.insert(0, "set actor.gradient_checkpointing=true (a token then costs a fraction of its activations)")
        logger.warning(
            "actor.max_tokens_per_mb=auto: %s passes get %d-token micro-batches (%.1f GiB free for them, "
            "%.0f KiB a token), %d for this pass's %d tokens; fewer, larger ones run faster: %s",
            kind,
            budget,
            free / 2**30,
            bytes_per_token / 1024,
            count,
            total,
            ", or ".join(ways),
        )

    @contextmanager
    def measure(self, kind: str, mb_tokens: list[int]):
        """Around one pass of `kind` whose micro-batches hold `mb_tokens` real tokens each: records a
        measurement when none exists or its largest micro-batch beats the measured one, and turns a
        CUDA out-of-memory error into AutoBudgetOutOfMemory."""
        if not self.measured:
            yield
            return
        tokens = max(mb_tokens, default=0)
        known = self.estimates.get(kind)
        take = tokens > 0 and (known is None or tokens > known.tokens)
        if take:
            base = self.memory.allocated()
            self.memory.reset_peak()
        try:
            yield
        except torch.OutOfMemoryError as exc:
            raise AutoBudgetOutOfMemory(self._oom_message(kind, tokens)) from exc
        if take:
            self.estimates[kind] = Measurement(tokens, self.memory.peak() - base)

    def _oom_message(self, kind: str, tokens: int) -> str:
        budget = self.used.get(kind, tokens)
        fixed = max(budget // 2 // GRANULE * GRANULE, 1)
        if kind not in self.estimates:
            what, more = f"the probe budget of {budget}", ""
        else:
            what, more = f"a measured budget of {budget}", f", raise actor.mb_memory_headroom (now {self.headroom})"
        return (
            f"CUDA out of memory in a {kind} pass at {what} tokens per micro-batch (largest: {tokens}), "
            f"chosen by actor.max_tokens_per_mb=auto: set actor.max_tokens_per_mb to a fixed number of tokens "
            f"below it (e.g. {fixed}){more}, or leave the trainer more memory (actor.fused_logprobs=true, "
            "a smaller sglang.mem_fraction_static)"
        )
