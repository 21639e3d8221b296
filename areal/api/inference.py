"""Inference-side interfaces: requests and responses in token ids, and the InferenceEngine ABC.

Weight updates, as the trainer drives them (RemoteSGLangEngine implements this):

    disk:         actor.save(path); engine.update_weights(WeightUpdateMeta("disk", path, version=v))
    distributed:  engine.init_weights_update_group(meta).result() after the trainer joined the group
                  (both sides must run concurrently: start the future, then init the trainer side);
                  per update: fut = engine.update_weights_from_distributed(meta); broadcast; fut.result()
    tensor:       engine.update_weights_from_tensor(meta, named_tensors) for servers on the trainer's
                  own device(s): the tensors travel as CUDA IPC handles (shared memory on CPU)

Both kinds pause generation on the servers unless the caller already paused (engine.pause()),
and set the engine's version to meta.version once every server has the new weights.
"""

from __future__ import annotations

import abc
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, Literal


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


@dataclass
class WeightUpdateMeta:
    """How a weight update reaches the servers."""

    type: Literal["disk", "distributed", "tensor"]
    path: str | None = None  # disk: the saved Hugging Face folder
    version: int | None = None  # the version the servers report after the update
    # disk, LoRA adapter pushes (actor.lora_push=adapter): path is a peft adapter folder that the
    # servers load under this name; later /generate requests name it in lora_path
    lora_name: str | None = None
    # distributed: the process group between trainer rank 0 (rank 0) and the servers
    master_address: str = "127.0.0.1"
    master_port: int = 0
    group_name: str = "areal_weight_update"
    backend: Literal["nccl", "gloo"] = "gloo"
    names: list[str] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    shapes: list[list[int]] = field(default_factory=list)
    # distributed and tensor updates come in buckets: the servers flush caches after the last
    flush_cache: bool = True


class InferenceEngine(abc.ABC):
    """A client of one or more inference servers."""

    @abc.abstractmethod
    def initialize(self) -> None:
        """Find the servers and wait until they are healthy."""

    @abc.abstractmethod
    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        """Generate one sample; survives pauses for weight updates without losing tokens."""

    @abc.abstractmethod
    def update_weights(self, meta: WeightUpdateMeta) -> None:
        """Disk updates: load meta.path on every server and set their version (blocking)."""

    @abc.abstractmethod
    def init_weights_update_group(self, meta: WeightUpdateMeta) -> Future:
        """Make every server join the trainer's weight-broadcast group; resolves when all joined."""

    @abc.abstractmethod
    def update_weights_from_distributed(self, meta: WeightUpdateMeta) -> Future:
        """Make every server receive the tensors the trainer broadcasts; resolves when loaded."""

    @abc.abstractmethod
    def destroy_weights_update_group(self, meta: WeightUpdateMeta) -> Future:
        """Make every server leave the broadcast group meta.group_name; resolves when all left."""

    @abc.abstractmethod
    def update_weights_from_tensor(self, meta: WeightUpdateMeta, named_tensors: list) -> list[dict]:
        """Servers on the trainer's device copy (name, tensor) pairs handed over through memory."""

    @property
    @abc.abstractmethod
    def group_world_size(self) -> int:
        """Ranks of a distributed update group: the trainer (rank 0) and every server's ranks."""

    @abc.abstractmethod
    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        """Servers free their KV cache and/or move their weights off the device (tags; None: both)."""

    @abc.abstractmethod
    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        """Servers take back what release_memory_occupation freed."""

    @abc.abstractmethod
    def pause(self) -> dict[str, float] | None:
        """Stop generation on every server (in-flight requests abort or wait, per pause mode).
        May return what the pause cost (logged under weight_update/ by the trainer)."""

    @abc.abstractmethod
    def resume(self) -> None:
        """Continue generation on every server."""

    @abc.abstractmethod
    def get_version(self) -> int:
        """The weight version new tokens are generated with."""

    @abc.abstractmethod
    def set_version(self, version: int) -> None:
        """Record the weight version (the trainer bumps it after each update)."""

    @abc.abstractmethod
    def destroy(self) -> None:
        """Close connections and worker threads."""
