"""Saving, evaluation, logging and recovery."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from .base import Section


class SaverConfig(Section):
    freq_steps: int | None = Field(
        None, ge=1, description="Save a Hugging Face model folder every N steps; null only at the end."
    )
    save_at_end: bool = Field(True, description="Save the final model.")


class EvaluatorConfig(Section):
    freq_steps: int | None = Field(None, ge=1, description="Evaluate every N steps; null disables.")
    max_samples: int | None = Field(None, ge=1, description="Evaluate on the first N test records.")
    max_new_tokens: int | None = Field(None, ge=1, description="Generation budget; null follows gconfig.")
    reward_fn: str | None = Field(
        None,
        description="Reward that decides correctness (pass@1 counts full rewards); null follows workflow.reward_fn.",
    )


class WandbConfig(Section):
    mode: Literal["disabled", "online", "offline"] = Field(
        "disabled",
        description="Weights & Biases: 'online' streams every step's metrics (the names of "
        "metrics.jsonl) to the W&B server, 'offline' writes them under the run directory's wandb/ (or "
        "$WANDB_DIR) for a later `wandb sync`, 'disabled' does neither. Needs the wandb package "
        "(pip install wandb).",
    )
    project: str | None = Field(None, description="W&B project; null follows experiment_name.")
    entity: str | None = Field(None, description="W&B entity (user or team); null uses your default entity.")
    name: str | None = Field(None, description="W&B run name; null follows trial_name.")
    group: str | None = Field(None, description="W&B run group, to compare runs side by side; null: none.")
    tags: list[str] = Field(default_factory=list, description="W&B run tags.")


class StatsLoggerConfig(Section):
    tensorboard: bool = Field(True, description="Write TensorBoard events when tensorboard is installed.")
    plot: bool = Field(True, description="Write metrics.png (reward, throughput) at the end of the run.")
    progress_bar: bool = Field(True, description="One-line console progress (step, reward, samples/s).")
    wandb: WandbConfig = Field(default_factory=WandbConfig, description="Weights & Biases tracking.")


class RecoverConfig(Section):
    mode: Literal["disabled", "auto"] = Field(
        "disabled", description="'auto' resumes from the last checkpoint of the same trial when one exists."
    )
    freq_steps: int | None = Field(None, ge=1, description="Write a recovery checkpoint every N steps; null disables.")
    keep_last: int = Field(1, ge=1, description="Recovery checkpoints kept.")


class ProfilerConfig(Section):
    steps: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=list,
        description="Training steps to trace with torch.profiler on every trainer rank, e.g. [3]; each writes "
        "RUN/profile/trainer-rank{r}-step{n}.trace.json.gz (summarise with scripts/trace_summary.py). "
        "Empty: no tracing.",
    )
    servers: bool = Field(
        True,
        description="Also trace the inference servers over the same steps (SGLang's /start_profile and "
        "/stop_profile; traces in RUN/profile/server-{i}/ on the servers' machines).",
    )
    with_stack: bool = Field(False, description="Record Python stacks of the ops (large traces, slower steps).")
    record_shapes: bool = Field(False, description="Record the input shapes of the ops.")
