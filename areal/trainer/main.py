"""Trainer worker entry: `python -m areal.trainer.main --config RUN_DIR/config.yaml`.

Started by areal-launch once per trainer rank (torch.distributed env from the launch plan). Also
runnable by hand for debugging with a single rank:
    python -m areal.trainer.main --config /tmp/areal/experiments/NAME/TRIAL/config.yaml
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import TYPE_CHECKING

from areal.infra.mps import report_attachment
from areal.infra.sockets import OpenFileLimitError, raise_open_file_limit, raise_rollout_client_open_files
from areal.utils.gil import shorten_gil_switch_interval

if TYPE_CHECKING:
    from areal.api.source import RolloutSource
    from areal.api.train import TrainEngine
    from areal.config.experiment import ExperimentConfig

    from .context import TrainContext

logger = logging.getLogger("areal.trainer")

WARMUP_TOKENS = 16  # per warm-up request: enough decode steps to compile every decode kernel


def load_run_config(path: str):
    """The resolved config the launcher wrote (validated again: it may have been edited by hand)."""
    import yaml

    from areal.config import validate_config

    with open(path) as f:
        return validate_config(yaml.safe_load(f))


def resolve_model_paths(cfg) -> None:
    """tiny:<preset> names become the folder every process of the run shares."""
    from areal.models.resolve import resolve_model_path

    for section, key in (
        ("actor", "path"),
        ("actor", "tokenizer_path"),
        ("ref", "path"),
        ("sglang", "model_path"),
        ("sglang", "tokenizer_path"),
    ):
        obj = getattr(cfg, section)
        if getattr(obj, key):
            setattr(obj, key, resolve_model_path(getattr(obj, key)))


ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"


def colocated_allocator(cfg, environ=os.environ) -> str | None:
    """A trainer colocated with its servers maps its CUDA memory in segments that grow and shrink
    (expandable_segments:True, as the built-in server does) unless PYTORCH_CUDA_ALLOC_CONF is set.
    With fixed cached blocks, freed memory stayed in fragments beside SGLang: 5.2-7.5 GiB of them
    when the trainer ran out of memory asking for 210-594 MiB (one H100, micro-batches sized from
    free memory, 2026-12-06); the pipeline ran as fast with segments (0.992x, three steps each).
    Set before the first CUDA allocation reads it; returns the value set, or None."""
    if not cfg.launcher.colocate or ALLOC_CONF in environ:
        return None
    environ[ALLOC_CONF] = "expandable_segments:True"
    return environ[ALLOC_CONF]


def build_context(cfg: ExperimentConfig) -> TrainContext:
    """Engines, the rollout source, data, evaluation and logging of this rank."""
    from areal.config.experiment import trainer_memory_share
    from areal.engine.fsdp.engine import FSDPEngine

    from .context import TrainContext, seed_everything
    from .sources import broadcast_from_rank0

    names = dict(experiment_name=cfg.experiment_name, trial_name=cfg.trial_name, fileroot=cfg.cluster.fileroot)
    actor = FSDPEngine(cfg.actor, memory_share=trainer_memory_share(cfg), **names)
    seed_everything(cfg.seed, 0)
    # the data comes before engine initialisation: the LR schedule needs the total step count
    source_parts = _source_parts(cfg)
    steps_per_epoch = source_parts["steps_per_epoch"]
    total = cfg.total_train_epochs * steps_per_epoch
    if cfg.total_train_steps:
        total = min(total, cfg.total_train_steps) if steps_per_epoch else cfg.total_train_steps
    # the schedule counts optimizer steps: each training step makes one per PPO minibatch
    actor.initialize(total_train_steps=total * cfg.actor.ppo_n_minibatches)
    report_attachment(logger, f"trainer rank {actor.rank}")  # launcher.mps: its CUDA context exists now
    seed_everything(cfg.seed, actor.rank)
    ref = _build_ref(cfg, names) if cfg.actor.kl_ctl > 0 else None
    source = _build_source(cfg, actor, source_parts)
    ctx = TrainContext(
        cfg=cfg,
        actor=actor,
        ref=ref,
        source=source,
        total_steps=total,
        steps_per_epoch=steps_per_epoch,
        temperature=cfg.gconfig.temperature or 1.0,
    )
    if cfg.evaluator.freq_steps and actor.is_rank0:
        ctx.eval_records, ctx.eval_workflow = _eval_parts(cfg)
    if actor.is_rank0:
        warm_up_servers(cfg, source, ctx.eval_records)
        from areal.utils.stats_logger import StatsLogger

        sl = cfg.stats_logger
        ctx.stats = StatsLogger(
            cfg.run_dir,
            tensorboard=sl.tensorboard,
            plot=sl.plot,
            progress=sl.progress_bar,
            total_steps=total,
            wandb=sl.wandb.model_dump(),
            run_config=cfg.model_dump(),
        )
    broadcast_from_rank0(None)  # every rank is set up before the first step
    return ctx


def warm_up_servers(cfg, source, eval_records) -> None:
    """rollout.server_warmup, before step 0 (rank 0): short requests at the generation concurrency
    (episodes in flight x samples each) with the run's sampling settings, at the evaluation batch
    (greedy), then both at once (an asynchronous run evaluates while the next batch generates)."""
    from areal.api.inference import ModelRequest

    engine = source.rollout_engine
    mode = cfg.rollout.server_warmup
    if engine is None or mode == "off" or (mode == "auto" and engine.server_kind != "sglang"):
        return
    from areal.workflow.common import load_tokenizer

    prompt = load_tokenizer(cfg.actor.tokenizer_path).encode("Warm-up. " * 64)[:128]
    r = cfg.rollout
    sampled = ModelRequest.from_gconfig(
        prompt, cfg.gconfig, max_new_tokens=WARMUP_TOKENS, min_new_tokens=0, ignore_eos=True
    )
    greedy = sampled.copy(temperature=0.0, top_p=1.0, top_k=-1)
    generation = [sampled] * ((r.max_concurrent_rollouts or r.consumer_batch_size) * cfg.gconfig.n_samples)
    evaluation = [greedy] * len(eval_records or [])
    seconds = engine.warm_up(
        [("generation", generation), ("evaluation", evaluation), ("both", generation + evaluation)]
    )
    logger.info("servers warmed up in %.1f s (rollout.server_warmup)", seconds)


def _source_parts(cfg) -> dict:
    from .data import PromptLoader, load_records

    if cfg.rollout.replay_path:
        from .rollouts import read_index

        return {"loader": None, "steps_per_epoch": len(read_index(cfg.rollout.replay_path)["batches"])}
    records = load_records(
        cfg.train_dataset, tokenizer=cfg.actor.tokenizer_path, system_prompt=cfg.workflow.system_prompt
    )
    loader = PromptLoader(records, cfg.train_dataset.batch_size, shuffle=cfg.train_dataset.shuffle, seed=cfg.seed)
    return {"loader": loader, "steps_per_epoch": len(loader)}


def _build_source(cfg: ExperimentConfig, actor: TrainEngine, parts: dict) -> RolloutSource:
    import torch.distributed as dist

    from areal.engine.sglang.client import RemoteSGLangEngine

    from .sources import LiveRollouts, ReplayRollouts

    rank0 = dist.get_rank() == 0
    if cfg.rollout.replay_path:
        external = None
        if rank0 and cfg.rollout.server_addrs:
            external = RemoteSGLangEngine(cfg)
            external.initialize()
        return ReplayRollouts(cfg, actor, external=external)
    engine = workflow = None
    if rank0:
        from areal.workflow.registry import build_workflow

        engine = RemoteSGLangEngine(cfg)
        engine.initialize()
        workflow = build_workflow(cfg, cfg.actor.tokenizer_path)
        where = "external servers" if cfg.launcher.rollout_n_nodes == 0 else "the run's servers"
        logger.info("rollouts from %s %s; weight updates (%s) go to them", where, engine.addrs, cfg.actor.weight_update)
    return LiveRollouts(cfg, actor, rank0_engine=engine, workflow=workflow, loader=parts["loader"])


def _build_ref(cfg, names):
    from areal.engine.fsdp.engine import FSDPEngine

    ref_cfg = cfg.actor.model_copy(
        update={
            "path": cfg.ref.path,
            "tokenizer_path": cfg.actor.tokenizer_path,
            "dtype": cfg.ref.dtype,
            "use_lora": False,
        }
    )
    ref = FSDPEngine(ref_cfg, trainable=False, **names)
    ref.initialize()
    return ref


def _eval_parts(cfg):
    from areal.workflow.registry import build_workflow

    from .data import load_records

    records = load_records(
        cfg.valid_dataset,
        key="valid_dataset",
        tokenizer=cfg.actor.tokenizer_path,
        system_prompt=cfg.workflow.system_prompt,
    )
    if cfg.evaluator.max_samples:
        records = records[: cfg.evaluator.max_samples]
    eval_cfg = cfg.model_copy(deep=True)
    eval_cfg.gconfig.temperature = 0.0
    eval_cfg.gconfig.n_samples = 1
    if cfg.evaluator.max_new_tokens:
        eval_cfg.gconfig.max_new_tokens = cfg.evaluator.max_new_tokens
    eval_cfg.workflow.reward_fn = cfg.evaluator.reward_fn or cfg.workflow.reward_fn
    # the training thread waits while an evaluation runs: its episodes take no GIL from training,
    # and in the trainer's process they spare a worker process and its start-up
    eval_cfg.workflow.workers = 0
    return records, build_workflow(eval_cfg, cfg.actor.tokenizer_path)


def run(cfg) -> None:
    from .grpo import train

    resolve_model_paths(cfg)
    ctx = build_context(cfg)
    try:
        ctx.maybe_recover()
        if ctx.eval_records is not None or cfg.evaluator.freq_steps:
            if ctx.start_step == 1:
                # the evaluation before any training, as step 0 (no rollout or loss yet: null)
                ctx.log(
                    0,
                    {
                        "step": 0,
                        "epoch": 0,
                        "weight_version": ctx.version,
                        "rollout/reward_mean": None,
                        "train/loss": None,
                        "timing/step_s": 0.0,
                        **ctx.run_eval(),
                    },
                )
        train(ctx)
    finally:
        ctx.close()
        ctx.actor.destroy()


def prepare_rollout_client_process(cfg, what: str) -> bool:
    """Set up the process that runs cfg's rollout client: a short GIL switch interval, and an
    open-file limit for every request in flight (each holds a socket: fail here, not with
    'accept() out of system resource'). False, with the reason logged, when the limit is too low."""
    shorten_gil_switch_interval(cfg.rollout.gil_switch_interval_ms)
    try:
        raise_rollout_client_open_files(cfg, what)
    except OpenFileLimitError as exc:
        logger.error("%s", exc)
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="areal trainer worker (one rank)")
    p.add_argument("--config", required=True, help="the run's resolved config.yaml")
    args = p.parse_args(argv)
    # transformers draws a "Loading weights" bar on stderr for every model it loads (the actor, a
    # reference model, each recovery): a line of the console that says nothing, since the load's
    # seconds are the trainer's start. Set before transformers is imported; "0" keeps the bars.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from areal.infra.log_format import setup_process_logging

    setup_process_logging(stream=sys.stderr)
    cfg = load_run_config(args.config)
    if colocated_allocator(cfg):
        logger.info("colocated: the trainer's CUDA allocator uses expandable segments (%s)", ALLOC_CONF)
    if int(os.environ.get("RANK", "0")) == 0:  # rank 0 runs the rollout client thread
        if not prepare_rollout_client_process(cfg, "trainer rank 0 (the rollout client)"):
            return 1
    else:
        raise_open_file_limit()
    run(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
