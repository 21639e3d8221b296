"""What every route of the built-in server shares: one `ServerState` per server process, and
`Routes`, the base of each route family, which holds it.

Built once by `__main__.build_state` and handed to each route family (routes_*.py,
openai_api.py); only the event loop's thread changes it, except what the scheduler owns.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Callable

from areal.server.memory import KVBudget, MemoryOccupation
from areal.server.scheduler import Scheduler, Sequence
from areal.server.weights import WeightUpdater


@dataclass
class ServerState:
    """Everything the handlers share; one per server process."""

    args: object
    runner: object
    tokenizer: object | None
    scheduler: Scheduler
    updater: WeightUpdater
    context_length: int
    weight_version: str
    eos_ids: set[int]
    weight_roots: list[str] = field(default_factory=list)  # see weights.weight_roots
    memory: MemoryOccupation | None = None  # release/resume; see memory.py
    kv_budget: KVBudget | None = None  # how max_total_num_tokens was reached
    accepted: int = 0  # /generate requests inside the server (held, queued or running)
    accept_out_of_files: int = 0  # accept() failures for want of descriptors (connections.py)
    open_connections: Callable[[], int] | None = None  # connections the HTTP server holds (set by serve())
    gate: asyncio.Event = field(default_factory=asyncio.Event)  # set = not paused
    lora_ops: int = 0  # LoRA loads/unloads in progress; requests naming an adapter wait for them
    lora_idle: asyncio.Event = field(default_factory=asyncio.Event)  # set = lora_ops == 0
    inflight: dict[str, Sequence] = field(default_factory=dict)
    started: float = field(default_factory=time.time)

    def __post_init__(self):
        self.gate.set()
        self.lora_idle.set()

    @property
    def capacity(self) -> int:
        return self.args.max_running_requests + self.args.max_queued_requests

    def set_weight_version(self, version: str) -> None:
        """Take `version` and mark where it starts in every sequence in flight. Paused (in_place
        or retract, as a weight update pauses) no step runs meanwhile, so the index is exact;
        a version set mid-generation lands on a step boundary seen from this thread."""
        self.weight_version = version
        for seq in list(self.inflight.values()):
            seq.version_spans.append((len(seq.output_ids), version))


class Routes:
    """A family of routes (routes_*.py, openai_api.py): its handlers share the state as `self.s`."""

    def __init__(self, state: ServerState):
        self.s = state
