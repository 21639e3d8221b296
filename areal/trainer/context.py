"""Everything one trainer rank holds during a run, and the per-step side duties (save, eval, log).

Built by `build_context(cfg)`; the loop in grpo.py only calls its methods.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from areal.api.source import LoaderPosition
from areal.utils.stats_logger import accuracy_standard_error

if TYPE_CHECKING:
    from areal.api.source import RolloutSource
    from areal.api.train import TrainEngine
    from areal.api.workflow import RolloutWorkflow
    from areal.config.experiment import ExperimentConfig
    from areal.utils.stats_logger import StatsLogger

logger = logging.getLogger("areal.trainer")


@dataclass
class TrainContext:
    cfg: ExperimentConfig
    actor: TrainEngine
    ref: TrainEngine | None  # the frozen reference policy of the KL penalty (actor.kl_ctl > 0)
    source: RolloutSource
    total_steps: int
    steps_per_epoch: int
    start_step: int = 1
    version: int = 0  # the weight version: updates pushed so far (the loop owns it; checkpoints keep it)
    eval_records: list[dict[str, Any]] | None = None  # rank 0, when evaluating
    eval_workflow: RolloutWorkflow | None = None  # rank 0, when evaluating
    stats: StatsLogger | None = None  # rank 0
    temperature: float = 1.0
    history: list[dict[str, Any]] = field(default_factory=list)  # each logged step's metrics
    step_records: list[int] | None = None  # the record ids of the step being logged (grpo_step)

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.run_dir)

    @property
    def phase_marker(self) -> Path:
        """RUN/logs/trainer-K.phase: the step and phase this rank is in (grpo.Phases writes it)."""
        folder = self.run_dir / "logs"
        folder.mkdir(parents=True, exist_ok=True)
        return folder / f"trainer-{self.actor.rank}.phase"

    def epoch(self) -> int:
        return self.source.loader_state().epoch if self.source else 0

    # ---- side duties -----------------------------------------------------------------------------
    def save(self, step: int) -> None:
        """The model saves of this step (saver.*); the recovery checkpoint is `checkpoint`."""
        from .checkpoint import should_save

        saver = self.cfg.saver
        if should_save(step, saver.freq_steps) or (saver.save_at_end and step == self.total_steps):
            name = "final" if step == self.total_steps else f"step_{step:08d}"
            self.actor.save(str(self.run_dir / "models" / name))
            if self.actor.is_rank0:
                logger.info("step %d: model saved to %s", step, self.run_dir / "models" / name)

    def checkpoint(self, step: int) -> None:
        """The recovery checkpoint of step N (recover.freq_steps), written once step N is logged.

        A run resumed from it starts at N + 1 and keeps the rows of steps <= N in metrics.jsonl and
        prompts.jsonl, so they must be on disk first: written inside the step (as it was), a crash
        between the checkpoint and the log lost step N's rows for good (found by scripts/chaos.py).
        """
        from .checkpoint import TrainerState, save_checkpoint, should_save

        recover = self.cfg.recover
        if should_save(step, recover.freq_steps):
            self.phase_marker.write_text(f"step {step} checkpoint\n")
            t0 = time.perf_counter()
            state = TrainerState(
                step=step,
                epoch=self.epoch(),
                weight_version=self.version,
                extra={"loader": self.source.loader_state().as_dict()},
            )
            folder = save_checkpoint(self.actor, self.run_dir, state, keep_last=recover.keep_last)
            if self.actor.is_rank0:
                logger.info(
                    "step %d: checkpoint saved to %s in %.1f s (recover.mode=auto resumes from it)",
                    step,
                    folder,
                    time.perf_counter() - t0,
                )

    def evaluate(self, step: int) -> dict[str, float]:
        freq = self.cfg.evaluator.freq_steps
        if not freq or not (step % freq == 0 or step == self.total_steps):
            return {}
        return self.run_eval()

    def run_eval(self) -> dict[str, float]:
        """Greedy pass@1 on the validation records (rank 0 generates; all ranks get the result)."""
        from .sources import broadcast_from_rank0

        result = None
        engine = self.source.rollout_engine
        if engine is not None and self.eval_workflow is not None:
            batch = engine.rollout_batch(self.eval_records, self.eval_workflow)
            rewards = batch["rewards"].float()
            accuracy = float((rewards >= 1.0 - 1e-6).float().mean())
            result = {
                "eval/accuracy": accuracy,
                "eval/accuracy_se": accuracy_standard_error(accuracy, rewards.numel()),
                "eval/reward_mean": float(rewards.mean()),
                "eval/n": int(rewards.numel()),
            }
        return broadcast_from_rank0(result) or {}

    def log(self, step: int, metrics: dict) -> None:
        self.history.append(metrics)
        if self.stats is not None:
            if self.step_records is not None:
                from .prompt_log import PromptLog

                PromptLog(self.run_dir).append(step, self.step_records)
            self.stats.log(step, metrics)
        self.step_records = None

    # ---- recovery --------------------------------------------------------------------------------
    def maybe_recover(self) -> None:
        """recover.mode=auto: continue after the last checkpoint and push its weights to the servers."""
        from .checkpoint import load_latest, restore_checkpoint

        if self.cfg.recover.mode != "auto":
            self._say_metrics_appended()
            return
        found = load_latest(self.run_dir)
        if found is None:
            logger.info("recover.mode=auto: no checkpoint under %s, starting fresh", self.run_dir / "checkpoints")
            self._forget_metrics_from(0)
            return
        folder, _ = found
        state = restore_checkpoint(self.actor, folder)
        loader_state = state.extra.get("loader")
        if loader_state:
            self.source.restore_position(LoaderPosition.from_dict(loader_state))
        self.start_step = state.step + 1
        self._forget_metrics_from(self.start_step)  # the killed run logged them; they are redone now
        self.source.count_trained_batches(state.weight_version)  # the staleness bound goes on from there
        self.source.push_weights(state.weight_version)
        self.version = state.weight_version
        logger.info(
            "recovered from %s: resuming at step %d, weight version %d", folder, self.start_step, state.weight_version
        )

    def _say_metrics_appended(self) -> None:
        """A fresh run in a folder an earlier run logged to appends its rows to the same
        metrics.jsonl (readers take each step's last row): say so once, at the start."""
        earlier = self.stats.earlier_steps if self.stats is not None else []
        if earlier:
            logger.warning(
                "%s already holds %d row(s) of an earlier run (steps %d-%d): this run's rows follow them, and "
                "readers take each step's last row. Another trial_name keeps the runs apart; recover.mode=auto "
                "resumes the earlier run instead",
                self.stats.metrics_path,
                len(earlier),
                min(earlier),
                max(earlier),
            )

    def _forget_metrics_from(self, step: int) -> None:
        if self.stats is not None:
            from .prompt_log import PromptLog

            dropped = self.stats.drop_rows_from(step)
            PromptLog(self.run_dir).drop_from(step)
            if dropped:
                logger.info("metrics.jsonl: dropped %d row(s) of steps >= %d logged before the restart", dropped, step)

    def close(self) -> None:
        if self.stats is not None:
            self.stats.close()
        # before the source: the evaluation workflow's proxy runs on the source's executor loop
        if self.eval_workflow is not None:
            self.eval_workflow.close()
        self.source.destroy()


def seed_everything(seed: int, rank: int) -> None:
    import numpy as np

    random.seed(seed + rank)
    np.random.seed(seed + rank)
    torch.manual_seed(seed + rank)
