"""Inference-side interfaces: requests and responses in token ids, and the InferenceEngine ABC.

An InferenceEngine generates; its `control` (areal/engine/sglang/control.py, ServerControl) is the
one object that pauses the servers, takes the trainer's new weights and continues them:

    with engine.control.weight_update(version) as update:
        update.load_disk(path)                       # disk: a saved Hugging Face folder
        update.load_tensors(bucket)                  # tensor: servers on the trainer's device(s)
        update.load_broadcast(meta).result()         # distributed: the trainer broadcasts meanwhile

FSDPEngine.update_weights(meta, inference=engine) does exactly that from the trainer's shards.
The pause mode (abort, retract, in_place; areal.infra.pause) is resolved before the engine starts.
"""

from __future__ import annotations

import abc
import uuid
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
    def control(self):
        """The ServerControl of these servers: pause / continue, weight updates, memory hand-off."""

    @abc.abstractmethod
    def get_version(self) -> int:
        """The weight version new tokens are generated with (the control's served version)."""

    @abc.abstractmethod
    def destroy(self) -> None:
        """Close connections and worker threads."""
