"""Inference-side interfaces: requests and responses in token ids, the InferenceEngine ABC, and
the InferenceControl its servers are ordered through.

An InferenceEngine generates; its `control` (areal/engine/sglang/control.py, ServerControl) is the
one object that pauses the servers, takes the trainer's new weights and continues them:

    with engine.control.weight_update(meta) as sink:   # pause (the control's pause mode)
        actor.update_weights(meta, sink)               # the trainer pushes into the sink
    # leaving the block: flush where the mode allows, record meta.version, continue

The weight path is areal/api/weights.py. The pause mode (abort, retract, in_place;
areal.infra.pause) is resolved before the control is built, and does not change after.
"""

from __future__ import annotations

import abc
import uuid
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ContextManager, Literal, Protocol

if TYPE_CHECKING:
    from .weights import WeightSink, WeightUpdateMeta


@dataclass
class ModelRequest:
    """One generation (one sample) for a prompt given as token ids."""

    input_ids: list[int]
    max_new_tokens: int = 1024
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)
    # SGLang's sampling_seed: the draws depend only on it and the token positions, not on the
    # requests the server batches this one with (areal/rollout/seeds.py); None: the server's generator
    sampling_seed: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_gconfig(cls, input_ids: list[int], gconfig, **overrides) -> "ModelRequest":
        """A request with the sampling parameters of a GenerationConfig (n_samples is the caller's)."""
        fields = {
            k: getattr(gconfig, k)
            for k in ("max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k", "ignore_eos")
        }
        fields["stop"] = list(gconfig.stop)
        fields["stop_token_ids"] = list(gconfig.stop_token_ids)
        return cls(input_ids=list(input_ids), **{**fields, **overrides})

    def copy(self, **changes) -> "ModelRequest":
        """A copy with a fresh rid (each sample is its own request) unless one is given."""
        changes.setdefault("rid", uuid.uuid4().hex)
        return replace(self, input_ids=list(self.input_ids), metadata=dict(self.metadata), **changes)


@dataclass
class ModelResponse:
    """A finished generation; every output token records the weight version that produced it."""

    input_tokens: list[int]
    output_tokens: list[int]
    output_logprobs: list[float]
    output_versions: list[int]
    stop_reason: Literal["stop", "length", "abort"]
    latency: float
    rid: str = ""

    @property
    def input_len(self) -> int:
        return len(self.input_tokens)

    @property
    def output_len(self) -> int:
        return len(self.output_tokens)


class GateListener(Protocol):
    """What follows a control's generation gate (the rollout executor, episode workers)."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...


class InferenceControl(Protocol):
    """The control calls of a set of inference servers: the generation gate, weight updates, the
    served version and the memory hand-off of a time-shared device."""

    lora_name: str | None  # the LoRA adapter /generate requests name (adapter pushes), if any

    @property
    def addrs(self) -> list[str]:
        """The servers (host:port), fixed when the control is built."""

    @property
    def pause_mode(self) -> str:
        """abort, retract or in_place, fixed when the control is built."""

    @property
    def paused(self) -> bool: ...

    def pause(self, mode: str | None = None) -> dict[str, float]:
        """Pause generation on every server (`mode`, default pause_mode); the weight update that
        follows flushes according to the mode the pause used."""

    def resume(self) -> None:
        """Continue generation on every server."""

    def pause_ahead(self) -> None:
        """Start the pause of the coming weight update now, in the background; weight_update waits
        for it instead of pausing (nothing when paused already)."""

    def add_listener(self, listener: GateListener) -> None:
        """`listener` pauses and resumes with every pause and continue."""

    def remove_listener(self, listener: GateListener) -> None: ...

    def weight_update(self, meta: WeightUpdateMeta) -> ContextManager[WeightSink]:
        """Pause, yield the sink the weights are pushed into; then flush where the pause allows,
        record meta.version and continue."""

    def update_weights(self, meta: WeightUpdateMeta) -> list[dict]:
        """A whole disk update (meta.path, or an adapter folder with meta.lora_name) in one call."""

    def get_version(self) -> int:
        """The weight version the servers generate with."""

    def set_version(self, version: int) -> None:
        """Record the served version without an update (servers that already hold it)."""

    def server_info(self, addr: str) -> dict: ...

    def release_memory_occupation(self, tags: list[str] | None = None) -> None: ...

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None: ...


class InferenceEngine(abc.ABC):
    """A client of one or more inference servers: it generates, and its `control` orders pauses
    and weight updates (see the module docstring)."""

    @abc.abstractmethod
    def initialize(self) -> None:
        """Find the servers and wait until they are healthy."""

    @abc.abstractmethod
    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        """Generate one sample; survives pauses for weight updates without losing tokens."""

    @property
    @abc.abstractmethod
    def control(self) -> InferenceControl:
        """The control of these servers: pause / continue, weight updates, memory hand-off."""

    @abc.abstractmethod
    def get_version(self) -> int:
        """The weight version new tokens are generated with (the control's served version)."""

    @abc.abstractmethod
    def destroy(self) -> None:
        """Close connections and worker threads."""
