"""The RolloutSource interface: where a training step's batch comes from, and where its new weights go.

The training loop (areal/trainer/grpo.py) and its context (areal/trainer/context.py) call these
methods; areal/trainer/sources.py implements them for live rollouts from inference servers
(LiveRollouts) and for the replay of saved ones (ReplayRollouts). Every trainer rank calls every
method in the same order: implementations may run collectives inside.
"""

from __future__ import annotations

import abc
from typing import Any

from .train import Batch


class RolloutSource(abc.ABC):
    @abc.abstractmethod
    def next_batch(self) -> Batch:
        """The next step's full batch (the same on every rank; the loop takes its share)."""

    @abc.abstractmethod
    def batch_metrics(self) -> dict[str, float]:
        """Figures about how the last batch was made, logged with the step ({} when there are none)."""

    @abc.abstractmethod
    def push_weights(self, version: int) -> dict[str, float]:
        """Make `version` the actor's weight version, sending the weights wherever rollouts are
        generated (if anywhere); returns the update's figures."""

    def count_trained_batches(self, batches: int) -> None:
        """A recovered run resumes with `batches` batches trained on (its checkpoint's weight
        version): a source that bounds staleness counts them. Nothing to do by default."""

    @abc.abstractmethod
    def loader_state(self) -> dict[str, Any]:
        """The data position a checkpoint saves (with at least `epoch`)."""

    @abc.abstractmethod
    def destroy(self) -> None:
        """Close the source's server clients and workflow."""
