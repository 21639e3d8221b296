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
