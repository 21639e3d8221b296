"""The RolloutSource interface: where a training step's batch comes from, and where its new weights go.

The training loop (areal/trainer/grpo.py) and its context (areal/trainer/context.py) call these
methods; areal/trainer/sources.py implements them for live rollouts from inference servers
(LiveRollouts) and for the replay of saved ones (ReplayRollouts). Every trainer rank calls every
method in the same order: implementations may run collectives inside.
"""

from __future__ import annotations

import abc
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .inference import InferenceEngine
    from .train import Batch


@dataclass(frozen=True)
class LoaderPosition:
    """Where in the data a run stands: `position` batches of epoch `epoch` handed out, the next
    one starting at its record `offset` (non-zero when a recovered run resumes mid-batch).
    Checkpoints keep it as a dict (as_dict); dataloaders take it through load_state_dict."""

    epoch: int
    position: int
    offset: int = 0

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> "LoaderPosition":
        return cls(int(state["epoch"]), int(state["position"]), int(state.get("offset", 0)))

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class RolloutSource(abc.ABC):
    @property
    def rollout_engine(self) -> InferenceEngine | None:
        """Rank 0's client of the servers that generate (evaluation and warm-up use it); None on
        the other ranks and for sources without servers."""
        return None

    @abc.abstractmethod
    def next_batch(self) -> Batch:
        """The next step's full batch (the same on every rank; the loop takes its share)."""

    @abc.abstractmethod
    def batch_metrics(self) -> dict[str, float]:
        """Figures about how the last batch was made, logged with the step ({} when there are none)."""

    @abc.abstractmethod
    def push_weights(self, version: int) -> dict[str, float]:
        """Send the actor's weights as `version` wherever rollouts are generated (if anywhere);
        returns the update's figures. The caller owns the version."""

    def pause_ahead(self) -> None:
        """The step's last rollout.pause_ahead_minibatches minibatches start training: a source whose
        servers take new weights may start their pause now, for push_weights. Nothing by default."""

    def count_trained_batches(self, batches: int) -> None:
        """A recovered run resumes with `batches` batches trained on (its checkpoint's weight
        version): a source that bounds staleness counts them. Nothing to do by default."""

    @abc.abstractmethod
    def loader_state(self) -> LoaderPosition:
        """The data position a checkpoint saves."""

    @abc.abstractmethod
    def restore_position(self, position: LoaderPosition) -> None:
        """Continue from a checkpoint's data position (a recovered run)."""

    @abc.abstractmethod
    def destroy(self) -> None:
        """Close the source's server clients and workflow."""
