"""The TrainEngine interface: a policy that trains on padded batches of trajectories."""

from __future__ import annotations

import abc
from typing import Any, Callable

from .inference import InferenceEngine, WeightUpdateMeta

# A batch is a dict of tensors with a leading sequence dimension, right-padded:
#   input_ids [B, L], attention_mask [B, L] (1 on real tokens), loss_mask [B, L] (1 on generated
#   tokens), plus per-token logprobs / versions / advantages and per-sequence rewards.
Batch = dict[str, Any]
# loss_fn(logprobs, entropy, mb) -> (loss tensor, stats dict); logprobs[i, j] is the log-probability
# of input_ids[i, j] given the tokens before it (0 at position 0).
LossFn = Callable[..., Any]


class TrainEngine(abc.ABC):
    @abc.abstractmethod
    def initialize(self) -> None:
        """Build the device mesh, load and shard the model, create the optimizer."""

    @abc.abstractmethod
    def train_batch(self, batch: Batch, loss_fn: LossFn, loss_weight_fn: Callable[[Batch], float]) -> dict[str, float]:
        """One optimizer step over the batch (split into token-budget micro-batches)."""

    @abc.abstractmethod
    def forward(self, batch: Batch) -> Any:
        """Per-token logprobs of input_ids under the current weights (no gradient)."""

    @abc.abstractmethod
    def save(self, path: str, *, with_optimizer: bool = False) -> None:
        """Hugging Face folder (model + tokenizer), plus optimizer/scheduler state for recovery."""

    @abc.abstractmethod
    def load(self, path: str, *, with_optimizer: bool = False) -> None:
        """Inverse of save."""

    @abc.abstractmethod
    def update_weights(self, meta: WeightUpdateMeta, inference: InferenceEngine | None) -> None:
        """Send the current weights to the inference servers (disk or distributed)."""

    @abc.abstractmethod
    def get_version(self) -> int:
        """Weight version: the number of updates pushed so far."""

    @abc.abstractmethod
    def set_version(self, version: int) -> None:
        """Set the weight version (after recovery)."""

    @abc.abstractmethod
    def destroy(self) -> None:
        """Release the process group and memory."""
