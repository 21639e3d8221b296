"""One device, two processes, taking turns: the hand-off of a synchronous colocated run.

With launcher.colocate and sglang.enable_memory_saver (a synchronous run), each step goes

    generate (the server holds the device)
    -> release: the server frees its KV cache and moves its weights off the device
       (/release_memory_occupation); with actor.offload the trainer takes its state back
    -> recompute logprobs, train (the trainer holds the device)
    -> the trainer hands its allocator's cached blocks back,
       the server takes its weights back (/resume_memory_occupation tags=[weights]),
       the weight update lands in them; with actor.offload the trainer moves its state to CPU
    -> the server takes its KV cache back (tags=[kv_cache]) and generates the next batch.

The server is resumed only from what this object released: a step that starts without a release
(a recovered run pushing its checkpoint's weights, on a fresh server that holds its memory) resumes
nothing. SGLang 0.5.16's scheduler dies on a resume of a tag that is not released (KeyError in
weight_updater.resume_memory_occupation), and the built-in server refuses one.

Asynchronous colocated runs do not take turns: both processes stay resident and
sglang.mem_fraction_static splits the memory. Either way `memory_metrics` reports what each
process holds at the hand-off points (memory/...). Every trainer rank calls every method (the
trainer's offload is collective in spirit: each rank moves its own shards); only rank 0 talks to
the servers.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from areal.api.train import TrainEngine
    from areal.config.experiment import ExperimentConfig
    from areal.engine.sglang.client import RemoteSGLangEngine

GB = 2**30
# What the server hands the trainer, named, not "all": SGLang's all includes its 'cuda_graph' tag,
# which nothing here resumes (its graphs sit in a pausable region only with
# SGLANG_MEMORY_SAVER_CUDA_GRAPH=1, and would then be replayed on paused memory)
HANDED_OFF = ("kv_cache", "weights")


class TimeShare:
    def __init__(self, cfg: ExperimentConfig, actor: TrainEngine, engine: RemoteSGLangEngine | None = None):
        self.actor, self.engine = actor, engine  # engine: rank 0's RemoteSGLangEngine, else None
        self.colocated = cfg.launcher.colocate
        self.enabled = bool(self.colocated and cfg.sglang.enable_memory_saver)
        self.offload = self.enabled and cfg.actor.offload
        self._metrics: dict[str, float] = {}
        self.released: set[str] = set()  # what to_trainer took from the server, until resumed

    def start(self) -> None:
        """Before the first generation: the trainer leaves the device to the server."""
        if self.offload:
            self._timed("offload_s", self.actor.offload)

    def to_trainer(self) -> None:
        """After generation: the server frees the device for training."""
        if not self.enabled:
            return
        self._memory("generate")
        if self.engine is not None:
            # nothing should run in a synchronous run now, and no request may start either: abort
            # returns a stray request to the client (SGLang asserts when it must release memory with
            # a request held); the weight update that ends this step continues generation. Timed:
            # SGLang's abort pause may sleep a second for a request handler that has not let go of
            # its model-update lock (ServerControl._server_pause_mode)
            self._timed("pause_s", lambda: self.engine.control.pause(mode="abort", then_release=True))
            self._timed("release_s", lambda: self.engine.control.release_memory_occupation(list(HANDED_OFF)))
        self.released = set(HANDED_OFF)  # every rank keeps the same account as rank 0
        if self.offload:
            self._timed("onload_s", self.actor.onload)

    def weights_to_server(self) -> None:
        """Before the weight update: the server's weights come back so the update can land in them.
        (Both resident, asynchronous: only the memory readings, as memory/..._step_...)"""
        if not self.enabled:
            if self.colocated:
                self._memory("step")
            return
        self._memory("train")
        if "weights" in self.released:
            self._timed("trainer_cache_s", lambda: release_cached_memory(self.actor))
        self._resume("weights")

    def to_server(self) -> None:
        """After the weight update: the server gets its KV cache back and generates next."""
        if not self.enabled:
            return
        if self.offload:
            self._timed("offload_s", self.actor.offload)
        self._resume("kv_cache")

    def metrics(self) -> dict[str, float]:
        """This step's hand-off seconds (handoff/...) and memory readings (memory/...), once."""
        out, self._metrics = self._metrics, {}
        return out

    def _resume(self, tag: str) -> None:
        """The server takes `tag` back (handoff/resume_<tag>_s), if to_trainer released it."""
        if tag not in self.released:
            return
        self.released.discard(tag)
        if self.engine is not None:
            self._timed(f"resume_{tag}_s", lambda: self.engine.control.resume_memory_occupation([tag]))

    def _timed(self, name: str, fn) -> Any:
        t0 = time.perf_counter()
        result = fn()
        self._metrics[f"handoff/{name}"] = self._metrics.get(f"handoff/{name}", 0.0) + time.perf_counter() - t0
        return result

    def _memory(self, phase: str) -> None:
        self._metrics.update(memory_metrics(self.actor, self.engine, phase))


def release_cached_memory(actor: TrainEngine) -> None:
    """Hand the caching allocator's unused blocks back to the device before the server takes its
    memory back: a trainer whose micro-batches were sized from the memory the server had released
    (actor.max_tokens_per_mb=auto) kept it cached, and SGLang's resume then ran out of memory
    (one H100, 2026-12-06)."""
    import torch

    if torch.cuda.is_available() and actor.device_type == "cuda":
        torch.cuda.empty_cache()


def memory_metrics(actor: TrainEngine, engine: RemoteSGLangEngine | None, phase: str) -> dict[str, float]:
    """Device memory of the trainer (this rank) and of the first server, at the end of `phase`:
    memory/trainer_{phase}_peak_gb (the trainer's peak since the previous reading),
    memory/server_{phase}_reserved_gb and _peak_gb (what the server's /get_server_info reports).
    Empty on CPU."""
    import torch

    out: dict[str, float] = {}
    if torch.cuda.is_available() and actor.device_type == "cuda":
        out[f"memory/trainer_{phase}_peak_gb"] = torch.cuda.max_memory_allocated() / GB
        out[f"memory/trainer_{phase}_reserved_gb"] = torch.cuda.memory_reserved() / GB
        torch.cuda.reset_peak_memory_stats()
    if engine is not None and engine.addrs:
        try:
            memory = engine.control.server_info(engine.addrs[0]).get("memory") or {}
        except (OSError, RuntimeError, ValueError):
            memory = {}
        for key, name in (("reserved_bytes", "reserved"), ("max_allocated_bytes", "peak")):
            if isinstance(memory.get(key), (int, float)):
                out[f"memory/server_{phase}_{name}_gb"] = memory[key] / GB
    return out
