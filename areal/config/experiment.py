"""The whole experiment: one section per component, plus the few run-wide values.

Fields that say "null follows X" are filled in by `resolve_follow_defaults`, which
validate_config calls right after the type check, so the resolved config written to the run
directory holds concrete values. It is deliberately not a model validator: the schema's own
defaults (the Hydra base node) must keep those fields null so that they follow overrides.
"""

from __future__ import annotations

from pydantic import Field

from areal.infra.pause import streams_from_sglang

from .actor import ActorConfig, RefConfig
from .base import Section
from .cluster import ClusterConfig
from .data import DatasetConfig
from .io import EvaluatorConfig, ProfilerConfig, RecoverConfig, SaverConfig, StatsLoggerConfig
from .launcher import LauncherConfig
from .parallel import ParallelStrategyError, parse_parallel
from .rollout import GenerationConfig, RolloutConfig, WorkflowConfig
from .sglang import SGLangConfig


class ExperimentConfig(Section):
    experiment_name: str = Field(
        "areal", min_length=1, description="Experiment name (a folder under cluster.fileroot)."
    )
    trial_name: str = Field("trial0", min_length=1, description="Trial name (a folder under the experiment).")
    seed: int = Field(1, description="Seed of data order, sampling and initialisation.")
    total_train_epochs: int = Field(1, ge=1, description="Passes over the training set.")
    total_train_steps: int | None = Field(
        None, ge=1, description="Stop after this many steps (overrides epochs when smaller)."
    )
    cluster: ClusterConfig = Field(default_factory=ClusterConfig, description="Hardware and run directory.")
    launcher: LauncherConfig = Field(default_factory=LauncherConfig, description="Process launching.")
    actor: ActorConfig = Field(default_factory=ActorConfig, description="The trained policy.")
    ref: RefConfig = Field(default_factory=RefConfig, description="Reference model for the KL penalty.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Inference side and async limits.")
    gconfig: GenerationConfig = Field(default_factory=GenerationConfig, description="Sampling parameters.")
    workflow: WorkflowConfig = Field(default_factory=WorkflowConfig, description="Rollout workflow and reward.")
    sglang: SGLangConfig = Field(default_factory=SGLangConfig, description="Inference-server options.")
    train_dataset: DatasetConfig = Field(default_factory=DatasetConfig, description="Training prompts.")
    valid_dataset: DatasetConfig = Field(
        default_factory=lambda: DatasetConfig(split="test", shuffle=False),
        description="Evaluation prompts (used when evaluator.freq_steps is set).",
    )
    saver: SaverConfig = Field(default_factory=SaverConfig, description="Model saving.")
    evaluator: EvaluatorConfig = Field(default_factory=EvaluatorConfig, description="Periodic evaluation.")
    stats_logger: StatsLoggerConfig = Field(default_factory=StatsLoggerConfig, description="Metrics output.")
    recover: RecoverConfig = Field(default_factory=RecoverConfig, description="Checkpoints and resume.")
    profiler: ProfilerConfig = Field(
        default_factory=ProfilerConfig, description="torch.profiler traces of chosen steps."
    )

    @property
    def run_dir(self) -> str:
        return f"{self.cluster.fileroot}/{self.experiment_name}/{self.trial_name}"


def resolve_follow_defaults(cfg: ExperimentConfig) -> ExperimentConfig:
    """Fill every "null follows X" field in place; idempotent, so a resolved config re-validates unchanged."""
    a, s, r = cfg.actor, cfg.sglang, cfg.rollout
    if a.tokenizer_path is None and a.path is not None:
        a.tokenizer_path = a.path
    if s.model_path is None:
        s.model_path = a.path
    if s.tokenizer_path is None:
        s.tokenizer_path = a.tokenizer_path if s.model_path == a.path else s.model_path
    if s.dtype is None:
        s.dtype = a.dtype
    if s.random_seed is None:
        s.random_seed = cfg.seed
    if s.tp_size is None:
        try:
            s.tp_size = parse_parallel(r.backend, allowed_backends=("sglang",)).tp
        except ParallelStrategyError:
            pass  # reported by the rules pass with the key
    pushes_adapters = a.use_lora and a.lora_push == "adapter"  # SGLang must be started able to load them
    if s.enable_lora is None:
        s.enable_lora = pushes_adapters
    if s.enable_lora and s.max_lora_rank is None and pushes_adapters:
        s.max_lora_rank = a.lora_rank
    if s.enable_lora and s.lora_target_modules is None and pushes_adapters:
        s.lora_target_modules = list(a.target_modules)
    if s.incremental_streaming_output is None:  # on where SGLang streams: the flag acts on streams only
        s.incremental_streaming_output = streams_from_sglang(r.stream_interval, r.pause_mode)
    if r.consumer_batch_size is None:
        r.consumer_batch_size = cfg.train_dataset.batch_size
    if r.max_concurrent_rollouts is None:
        r.max_concurrent_rollouts = r.consumer_batch_size
    if a.eps_clip_low is None:
        a.eps_clip_low = a.eps_clip
    if a.eps_clip_high is None:
        a.eps_clip_high = a.eps_clip
    wb = cfg.stats_logger.wandb
    if wb.project is None:
        wb.project = cfg.experiment_name
    if wb.name is None:
        wb.name = cfg.trial_name
    if cfg.ref.dtype is None:
        cfg.ref.dtype = a.dtype
    if cfg.ref.path is None and a.kl_ctl > 0:
        cfg.ref.path = a.path
    if s.enable_memory_saver is None:
        s.enable_memory_saver = cfg.launcher.colocate and r.max_head_offpolicyness == 0
    return cfg


def trainer_memory_share(cfg: ExperimentConfig) -> float | None:
    """The share of each device the trainer's auto micro-batch budget may count on: beside colocated
    servers that keep their memory (not time-shared), 1 - sglang.mem_fraction_static -
    actor.mb_server_margin; otherwise None (the whole device: alone, or the servers release theirs
    while the trainer trains)."""
    if not cfg.launcher.colocate or cfg.sglang.enable_memory_saver:
        return None
    return 1.0 - cfg.sglang.mem_fraction_static - cfg.actor.mb_server_margin
