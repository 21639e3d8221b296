"""The weight path from a trainer to inference servers: what one update is, and the sink the
trainer pushes it into.

    meta = WeightUpdateMeta("disk", version=3)
    with control.weight_update(meta) as sink:   # rank 0: the servers' control pauses them
        actor.update_weights(meta, sink)          # every trainer rank; sink is None off rank 0
    # leaving the block: the control flushes where its pause mode allows, records the version and
    # continues generation

The caller owns the version: it names it in the meta, and nobody changes a meta once it is made.
The trainer engine produces the weights and pushes them into the sink; the sink (a WeightUpdate of
areal/engine/sglang/control.py) owns the transport to the servers, the broadcast group included.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol


@dataclass(frozen=True)
class WeightUpdateMeta:
    """How a weight update reaches the servers, and the version they report after it."""

    type: Literal["disk", "distributed", "tensor"]
    path: str | None = None  # disk: the saved Hugging Face folder (None: the run's weight_update/v{version})
    version: int | None = None  # the version the servers report after the update
    # disk, LoRA adapter pushes (actor.lora_push=adapter): path is a peft adapter folder that the
    # servers load under this name; later /generate requests name it in lora_path
    lora_name: str | None = None
    # distributed: the process group between trainer rank 0 (rank 0) and the servers
    master_address: str = "127.0.0.1"
    master_port: int = 0
    group_name: str = "areal_weight_update"
    backend: Literal["nccl", "gloo"] = "gloo"
    # distributed, one bucket: the tensors the servers receive from the broadcast, in order
    names: list[str] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    shapes: list[list[int]] = field(default_factory=list)


class WeightSink(Protocol):
    """One weight update in progress, generation paused: the trainer hands it the new weights,
    whole (a folder) or bucket by bucket (full tensors). Each load returns the servers' answers."""

    meta: WeightUpdateMeta  # the update's kind and version, as the caller made it
    # seconds of the control's stages (pause_s, flush_s, resume_s), what the servers said the pause
    # cost, and server_load_s: the slowest server's own seconds applying the loads, summed
    report: dict[str, float]
    folder: str | None  # the full-model folder the servers loaded (None: none yet, or an adapter)

    def load_disk(self, path: str) -> list[dict[str, Any]]:
        """Every server loads the Hugging Face folder `path`."""

    def load_adapter(self, path: str, name: str) -> list[dict[str, Any]]:
        """Every server loads the peft adapter folder `path` as LoRA adapter `name`."""

    def load_bucket(self, named_tensors: list[tuple[str, Any]]) -> list[dict[str, Any]]:
        """Every server takes one bucket of (Hugging Face name, full tensor) pairs: through CUDA IPC
        handles (meta.type tensor) or the broadcast group (distributed). The tensors must stay alive
        until this returns."""
