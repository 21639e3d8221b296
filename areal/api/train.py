"""The TrainEngine interface: a policy that trains on padded batches of trajectories."""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, Callable, Protocol, TypedDict

if TYPE_CHECKING:
    import torch

    from .weights import WeightSink, WeightUpdateMeta


class Batch(TypedDict, total=False):
    """A batch of trajectories: tensors with a leading sequence dimension B, right-padded to L.

    Other keys pass through untouched; tensors whose first dimension is B are split with the rows.
    """

    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L], 1 on real tokens
    loss_mask: torch.Tensor  # [B, L], 1 on generated tokens
    logprobs: torch.Tensor  # [B, L], the behaviour policy's, from the servers; 0 on the prompt
    versions: torch.Tensor  # [B, L], the weight version of each generated token
    rewards: torch.Tensor  # [B]
    # added by the algorithm
    advantages: torch.Tensor  # [B, L]
    prox_logprobs: torch.Tensor  # [B, L], recomputed by the trainer (decoupled loss)
    ref_logprobs: torch.Tensor  # [B, L], the reference policy's (KL penalty)


class LossFn(Protocol):
    """loss_fn(logprobs [b, l], entropy [b, l], mb) -> (scalar loss tensor, stats dict of scalars).

    mb is one micro-batch as a right-padded sub-batch (same keys, on the device); logprobs[i, j] is
    the log-probability of mb["input_ids"][i, j] given the tokens before it (0 at position 0 and
    on padding); entropy is that distribution's entropy (no gradient)."""

    def __call__(
        self, logprobs: torch.Tensor, entropy: torch.Tensor, mb: Batch
    ) -> tuple[torch.Tensor, dict[str, Any]]: ...


class TrainEngine(abc.ABC):
    """What the trainer (areal/trainer/: the loop, its context, the rollout sources) calls on a
    policy. Every trainer rank calls the same methods in the same order (most are collective)."""

    # ---- setup and layout ------------------------------------------------------------------------
    @abc.abstractmethod
    def initialize(self, total_train_steps: int | None = None) -> None:
        """Build the device mesh, load and shard the model, create the optimizer and LR schedule
        (total_train_steps, the optimizer steps, i.e. train_batch calls, that the schedule
        spans, is needed by decaying schedules and warmup)."""

    @property
    @abc.abstractmethod
    def rank(self) -> int:
        """This process's rank among all trainer processes (known after initialize)."""

    @property
    @abc.abstractmethod
    def is_rank0(self) -> bool:
        """Whether this is the trainer process that talks to the servers and writes shared files."""

    @property
    @abc.abstractmethod
    def device_type(self) -> str:
        """The kind of device the model computes on ("cuda" or "cpu")."""

    @abc.abstractmethod
    def dp_shard(self, batch: Batch) -> Batch:
        """This rank's share of a full batch (the rows its data-parallel group trains on)."""

    # ---- compute ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def train_batch(
        self, batch: Batch, loss_fn: LossFn, loss_weight_fn: Callable[[Batch], float], *, temperature: float = 1.0
    ) -> dict[str, float]:
        """One optimizer step over this rank's batch (split into token-budget micro-batches).

        Micro-batch losses are weighted by loss_weight_fn(mb) / (its sum over all data-parallel
        ranks), so the gradient is that of the weighted mean over the global batch."""

    @abc.abstractmethod
    def forward(self, batch: Batch, *, temperature: float = 1.0, with_entropy: bool = False) -> Any:
        """Per-token logprobs [B, L] of input_ids under the current weights (no gradient);
        (logprobs, entropy) when with_entropy."""

    # ---- save / load -----------------------------------------------------------------------------
    @abc.abstractmethod
    def save(self, path: str, *, with_optimizer: bool = False) -> None:
        """Hugging Face folder (model + tokenizer), plus optimizer/scheduler state for recovery."""

    @abc.abstractmethod
    def load(self, path: str, *, with_optimizer: bool = False) -> None:
        """Inverse of save."""

    @abc.abstractmethod
    def save_train_state(self, path: str) -> None:
        """Write what exact resumption needs (weights, optimizer, schedule) for a recovery checkpoint."""

    @abc.abstractmethod
    def load_train_state(self, path: str) -> None:
        """Inverse of save_train_state."""

    # ---- weights for the servers -----------------------------------------------------------------
    @abc.abstractmethod
    def update_weights(self, meta: WeightUpdateMeta, sink: WeightSink | None) -> dict[str, float]:
        """Push the current weights (disk, distributed or tensor) into rank 0's open sink as
        version meta.version (areal/api/weights.py; None on the other ranks), and return the
        update's seconds and bytes. The caller owns the version."""

    # ---- memory (colocated, time-shared runs) ----------------------------------------------------
    @abc.abstractmethod
    def offload(self) -> dict[str, float]:
        """Move the model and optimizer state off the device, for a server sharing it; returns seconds."""

    @abc.abstractmethod
    def onload(self) -> dict[str, float]:
        """Bring back what offload moved, for training; returns seconds."""

    # ---- teardown --------------------------------------------------------------------------------
    @abc.abstractmethod
    def destroy(self) -> None:
        """Release the process group and memory."""
