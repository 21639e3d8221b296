"""Where a training step's rollouts come from, and where its new weights go: the two
RolloutSource implementations (the interface is areal/api/source.py).

Every trainer rank calls the same methods (collectives inside); only rank 0 talks to servers:
  LiveRollouts    rank 0 runs the async executor against the inference servers (the run's own,
                  or external ones in a trainer-only run) and broadcasts each batch to all ranks;
                  weight updates go through rank 0's server control (pause, load, flush, continue).
  ReplayRollouts  trainer-only replay of an inference-only run's saved rollouts; weight updates
                  go to rollout.server_addrs when given, otherwise they are skipped (and logged).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from areal.api.source import LoaderPosition, RolloutSource
from areal.api.weights import WeightUpdateMeta

if TYPE_CHECKING:
    from areal.api.inference import InferenceControl
    from areal.api.train import Batch, TrainEngine
    from areal.api.weights import WeightSink
    from areal.api.workflow import RolloutWorkflow
    from areal.config.experiment import ExperimentConfig
    from areal.engine.sglang.client import RemoteSGLangEngine

    from .data import PromptLoader

logger = logging.getLogger("areal.trainer")


def broadcast_from_rank0(obj: Any) -> Any:
    if dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def weight_update_meta(cfg: ExperimentConfig) -> WeightUpdateMeta:
    """How this run's updates travel (actor.weight_update); each update adds its version."""
    import torch

    if cfg.actor.weight_update in ("disk", "tensor"):
        return WeightUpdateMeta(type=cfg.actor.weight_update)
    from areal.infra.ports import free_port

    return WeightUpdateMeta(
        type="distributed",
        master_port=free_port(),
        backend="nccl" if torch.cuda.is_available() else "gloo",
    )


def open_update(control: InferenceControl | None, meta: WeightUpdateMeta):
    """The weight update `control` opens on rank 0; on the other ranks (control None) a context
    whose sink is None."""
    return control.weight_update(meta) if control is not None else contextlib.nullcontext()


def update_figures(stats: dict[str, float], sink: WeightSink | None) -> dict[str, float]:
    """The engine's figures of one update with the control's stages (rank 0's sink report) as
    weight_update/..."""
    report = sink.report if sink is not None else {}
    return {**stats, **{f"weight_update/{k}": v for k, v in report.items()}}


def push_to_control(actor: TrainEngine, meta: WeightUpdateMeta, control: InferenceControl | None) -> dict[str, float]:
    """Every rank: push the actor's weights into the update that `control` opens (rank 0's; None
    on the others). Returns the update's figures (update_figures)."""
    with open_update(control, meta) as sink:
        stats = actor.update_weights(meta, sink)
    return update_figures(stats, sink)


class LiveRollouts(RolloutSource):
    def __init__(
        self,
        cfg: ExperimentConfig,
        actor: TrainEngine,
        *,
        rank0_engine: RemoteSGLangEngine | None = None,
        workflow: RolloutWorkflow | None = None,
        loader: PromptLoader | None = None,
    ):
        self.cfg, self.actor = cfg, actor
        self.engine, self.workflow, self.loader = rank0_engine, workflow, loader
        self._meta: WeightUpdateMeta | None = None
        self._counters: tuple[float, dict[str, float]] | None = None  # (time, servers' counters)
        self._bound_before: dict[str, float] = {}  # the executor's bound_seconds at the last batch_metrics
        self._order_wait_before = 0.0  # and its order_wait_seconds
        from .time_share import TimeShare

        self.time_share = TimeShare(cfg, actor, rank0_engine)  # colocated synchronous runs take turns
        if self.engine is not None:
            self.server_work()  # the baseline of the first step's figures
        self.time_share.start()

    def next_batch(self) -> Batch:
        """The next consumer batch; with rollout.dynamic_sampling, groups whose rewards are all
        equal are dropped and replaced by the executor (areal.algo.dynamic_sampling)."""
        batch = None
        if self.engine is not None:
            from areal.algo.dynamic_sampling import has_reward_variance

            accept = has_reward_variance if self.cfg.rollout.dynamic_sampling else None
            batch = self.engine.prepare_batch(self.loader, self.workflow, accept)
        batch = broadcast_from_rank0(batch)
        self.time_share.to_trainer()
        return batch

    def pause_ahead(self) -> None:
        """Rank 0: the servers start pausing for the coming weight update (ServerControl.pause_ahead)."""
        if self.engine is not None:
            self.engine.control.pause_ahead()

    def batch_metrics(self) -> dict[str, float]:
        """Rank 0 ({} elsewhere): the staleness bound's figures since the previous call,
        `rollout/bound_held_s` and `rollout/bound_idle_s` (RolloutExecutor.bound_seconds: seconds
        in which it held episodes back, and in which nothing ran meanwhile), `rollout/order_wait_s`
        (RolloutExecutor.order_wait_seconds: the wait for older episodes while enough had finished),
        and with rollout.dynamic_sampling the filter's figures for the last batch."""
        if self.engine is None:
            return {}
        executor = self.engine.executor
        now = executor.bound_seconds()
        before, self._bound_before = self._bound_before, now
        out = {f"rollout/bound_{k}": v - before.get(k, 0.0) for k, v in now.items()}
        order_wait = executor.order_wait_seconds()
        out["rollout/order_wait_s"], self._order_wait_before = order_wait - self._order_wait_before, order_wait
        if self.cfg.rollout.dynamic_sampling:
            from areal.algo.dynamic_sampling import filter_metrics

            out.update(filter_metrics(executor.last_batch_stats()))
        return out

    def push_weights(self, version: int) -> dict[str, float]:
        """Send the trainer's weights; servers then report `version`. Rank 0's server control
        pauses the servers, takes the weights, flushes where the pause allows and continues
        (ServerControl.weight_update); the memory hand-off of a time-shared step runs inside."""
        if self._meta is None:  # one rendezvous for the run: the broadcast group lives across updates
            self._meta = broadcast_from_rank0(weight_update_meta(self.cfg) if self.engine else None)
        meta = dataclasses.replace(self._meta, version=version)
        with open_update(self.engine.control if self.engine is not None else None, meta) as sink:
            # read while nothing runs: a step's figures then end where the next step's begin, and
            # no token of the next batch (which starts at continue) lands in this step's window
            work = self.server_work()
            self.time_share.weights_to_server()
            stats = self.actor.update_weights(meta, sink)
            self.time_share.to_server()
            # only a full-model folder: an adapter folder (lora_push=adapter) is no model a
            # restarted server could load
            if sink is not None and sink.folder is not None:
                self._record_served_weights(sink.folder, version)
        # with rank 0's pause, flush and continue: in an asynchronous run, the part of the update
        # that waits for in-flight generation (the servers' own share in server_pause_s)
        return {**update_figures(stats, sink), **work, **self.time_share.metrics()}

    def server_work(self) -> dict[str, float]:
        """What the built-in servers did since the previous call (one weight update apart, read
        while the servers are paused for it):
        `server/prefill_steps`, `server/decode_steps`, `server/generated_tokens`, their seconds,
        the mean decode batch, and `server/forward_frac`, the share of the time the servers spent
        in forward passes (1.0: generation never waited for the client or the trainer). Empty on
        the first call, for SGLang servers, and on ranks other than 0."""
        if self.engine is None:
            return {}
        now, counters = time.monotonic(), self.engine.batching_counters()
        previous, self._counters = self._counters, ((now, counters) if counters else None)
        if not counters or previous is None:
            return {}
        then, before = previous
        delta = {k: counters[k] - before.get(k, 0.0) for k in counters}
        out = {f"server/{k}": v for k, v in delta.items() if k != "decode_rows"}
        if delta["decode_steps"] > 0:
            out["server/mean_decode_batch"] = delta["decode_rows"] / delta["decode_steps"]
        window = (now - then) * len(self.engine.addrs)
        if window > 0:
            out["server/forward_frac"] = (delta["prefill_s"] + delta["decode_s"]) / window
        return out

    def _record_served_weights(self, path: str, version: int) -> None:
        """Name the folder the servers now serve, so a server the launcher restarts loads it
        (launcher.restart_failed_servers); only for the run's own servers."""
        if self.cfg.launcher.rollout_n_nodes > 0 and not self.cfg.rollout.server_addrs:
            from areal.infra.discovery import record_root_of, write_served_weights

            write_served_weights(record_root_of(self.cfg), path, version)

    def count_trained_batches(self, batches: int) -> None:
        if self.engine is not None:
            self.engine.executor.count_trained_batches(batches)

    @property
    def rollout_engine(self) -> RemoteSGLangEngine | None:
        return self.engine

    def loader_state(self) -> LoaderPosition:
        """The dataloader position to save: that of the oldest prompt not trained on yet. The
        loader itself has run ahead by the episodes queued and running in the executor."""
        state = None
        if self.loader is not None:
            state = self.engine.resume_state() if self.engine is not None else None
            state = state or LoaderPosition.from_dict(self.loader.state_dict())
        return broadcast_from_rank0(state)

    def restore_position(self, position: LoaderPosition) -> None:
        if self.loader is not None:
            self.loader.load_state_dict(position.as_dict())

    def destroy(self) -> None:
        # the workflow first: its proxy and client live on the executor's loop (or in worker
        # processes that follow the engine's control), which engine.destroy() stops
        if self.workflow is not None:
            self.workflow.close()
        if self.engine is not None:
            self.engine.destroy()


class ReplayRollouts(RolloutSource):
    def __init__(self, cfg: ExperimentConfig, actor: TrainEngine, *, external: RemoteSGLangEngine | None = None):
        """`external`: rank 0's client of rollout.server_addrs (None elsewhere, and when there are none)."""
        from .rollouts import read_index

        self.cfg, self.actor, self.external = cfg, actor, external
        self.push = bool(cfg.rollout.server_addrs)  # the same on every rank: update_weights is collective
        self.folder = cfg.rollout.replay_path
        self.entries = read_index(self.folder)["batches"]
        self.position = 0
        if self.push:
            logger.info("replaying %s; weight updates go to external servers %s", self.folder, cfg.rollout.server_addrs)
        else:
            logger.info(
                "replaying %s; no servers (rollout.server_addrs is empty): weight updates are skipped", self.folder
            )

    def batch_metrics(self) -> dict[str, float]:
        return {}  # replayed batches are trained as saved

    def next_batch(self) -> Batch:
        from .rollouts import load_batch

        entry = self.entries[self.position % len(self.entries)]
        self.position += 1
        return load_batch(self.folder, entry)

    def push_weights(self, version: int) -> dict[str, float]:
        if not self.push:
            return {"skipped": 1.0}
        control = self.external.control if self.external is not None else None
        return push_to_control(self.actor, WeightUpdateMeta(type="disk", version=version), control)

    def loader_state(self) -> LoaderPosition:
        """The replay position to save: batches handed out so far (they cycle through the index)."""
        return LoaderPosition(epoch=0, position=self.position)

    def restore_position(self, position: LoaderPosition) -> None:
        """Continue where a recovered run stopped: the next batch is the one after the last
        trained before its checkpoint (not the first again)."""
        self.position = position.position

    def destroy(self) -> None:
        if self.external is not None:
            self.external.destroy()
