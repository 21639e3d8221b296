"""The TrainEngine interface: a policy that trains on padded batches of trajectories."""

from __future__ import annotations

import abc
from typing import Any, Callable

from .inference import InferenceEngine, WeightUpdateMeta

# A batch is a dict of tensors with a leading sequence dimension, right-padded:
#   input_ids [B, L], attention_mask [B, L] (1 on real tokens), loss_mask [B, L] (1 on generated
#   tokens), logprobs [B, L] (behaviour policy, from the servers; 0 on the prompt), versions [B, L]
#   (weight version of each generated token), rewards [B]; the algorithm adds advantages [B, L],
#   prox_logprobs [B, L] (recomputed by the trainer) and ref_logprobs [B, L] (KL penalty).
# Other keys pass through untouched; tensors whose first dimension is B are split with the rows.
Batch = dict[str, Any]
# loss_fn(logprobs [b, l], entropy [b, l], mb) -> (scalar loss tensor, stats dict of scalars).
# mb is one micro-batch as a right-padded sub-batch (same keys, on the device); logprobs[i, j] is
# the log-probability of mb["input_ids"][i, j] given the tokens before it (0 at position 0 and
# on padding); entropy is that distribution's entropy (no gradient).
LossFn = Callable[..., Any]


class TrainEngine(abc.ABC):
    @abc.abstractmethod
    def initialize(self, total_train_steps: int | None = None) -> None:
        """Build the device mesh, load and shard the model, create the optimizer and LR schedule
        (total_train_steps is needed by decaying schedules and warmup)."""

    @abc.abstractmethod
    def train_batch(self, batch: Batch, loss_fn: LossFn, loss_weight_fn: Callable[[Batch], float], *,
                    temperature: float = 1.0) -> dict[str, float]:
        """One optimizer step over this rank's batch (split into token-budget micro-batches).

        Micro-batch losses are weighted by loss_weight_fn(mb) / (its sum over all data-parallel
        ranks), so the gradient is that of the weighted mean over the global batch."""

    @abc.abstractmethod
    def forward(self, batch: Batch, *, temperature: float = 1.0, with_entropy: bool = False) -> Any:
        """Per-token logprobs [B, L] of input_ids under the current weights (no gradient);
        (logprobs, entropy) when with_entropy."""

    @abc.abstractmethod
    def save(self, path: str, *, with_optimizer: bool = False) -> None:
        """Hugging Face folder (model + tokenizer), plus optimizer/scheduler state for recovery."""

    @abc.abstractmethod
    def load(self, path: str, *, with_optimizer: bool = False) -> None:
        """Inverse of save."""

    @abc.abstractmethod
    def update_weights(self, meta: WeightUpdateMeta, inference: InferenceEngine | None = None) -> dict[str, float]:
        """Send the current weights to the inference servers (disk or distributed), set the
        version to meta.version (or +1), and return the update's seconds and bytes."""

    @abc.abstractmethod
    def get_version(self) -> int:
        """Weight version: the number of updates pushed so far."""

    @abc.abstractmethod
    def set_version(self, version: int) -> None:
        """Set the weight version (after recovery)."""

    @abc.abstractmethod
    def destroy(self) -> None:
        """Release the process group and memory."""
