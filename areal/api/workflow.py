"""The RolloutWorkflow interface: one episode from one dataset record to training tensors."""

from __future__ import annotations

import abc
from typing import Any

from .inference import InferenceEngine


class RolloutWorkflow(abc.ABC):
    @abc.abstractmethod
    async def arun_episode(self, engine: InferenceEngine, data: dict[str, Any]) -> dict[str, Any] | None:
        """Generate and score the samples of one prompt.

        Returns a dict of tensors with a leading sample dimension (input_ids, attention_mask,
        loss_mask, logprobs, versions, rewards, ...), padded to a common length, or None to drop
        the prompt.
        """

    def close(self) -> None:
        """Release what the workflow holds (proxies, clients, worker processes); from any thread.
        Nothing to do by default."""

    async def aclose(self) -> None:
        """close() from inside the event loop its episodes ran on. Nothing to do by default."""
