"""Rollout driver of inference-only runs (`launcher.trainer_n_nodes=0`): no trainer, no GPU.

`python -m areal.trainer.driver --config RUN_DIR/config.yaml` runs the configured workflow over
the training set for `launcher.inference_only_batches` batches against the run's servers,
prints reward and throughput per batch, and saves the rollouts under `{run_dir}/rollouts/`
(format: areal/trainer/rollouts.py) for a trainer-only replay (`rollout.replay_path`).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

from areal.infra.log_format import setup_process_logging

logger = logging.getLogger("areal.driver")


def drive(cfg) -> list[dict]:
    from areal.engine.sglang.client import RemoteSGLangEngine
    from areal.workflow.registry import build_workflow

    from .data import PromptLoader, load_records
    from .main import resolve_model_paths
    from .rollouts import RolloutWriter

    resolve_model_paths(cfg)
    tokenizer = cfg.actor.tokenizer_path or cfg.sglang.tokenizer_path
    loader = PromptLoader(
        load_records(cfg.train_dataset, tokenizer=tokenizer, system_prompt=cfg.workflow.system_prompt),
        cfg.train_dataset.batch_size,
        shuffle=cfg.train_dataset.shuffle,
        seed=cfg.seed,
    )
    engine = RemoteSGLangEngine(cfg)
    engine.initialize()
    workflow = build_workflow(cfg, tokenizer)
    writer = RolloutWriter(f"{cfg.run_dir}/rollouts", cfg.gconfig.n_samples)
    reports = []
    try:
        batches = iter(loader)
        for i in range(cfg.launcher.inference_only_batches):
            t = time.perf_counter()
            records = next(batches, None)
            if records is None:
                batches = iter(loader)
                records = next(batches)
            batch = engine.rollout_batch(records, workflow)
            seconds = time.perf_counter() - t
            writer.write(batch)
            n = int(batch["input_ids"].shape[0])
            tokens = int(batch["loss_mask"].sum())
            report = {
                "batch": i,
                "reward_mean": float(batch["rewards"].float().mean()),
                "samples": n,
                "seconds": round(seconds, 3),
                "samples_per_s": round(n / seconds, 2),
                "gen_tokens_per_s": round(tokens / seconds, 1),
            }
            print(json.dumps(report), flush=True)
            reports.append(report)
    finally:
        workflow.close()  # first: its proxy runs on the executor that destroy() stops
        engine.destroy()
    print(f"saved {len(reports)} batches of rollouts to {cfg.run_dir}/rollouts", flush=True)
    return reports


def main(argv: list[str] | None = None) -> int:
    from .main import load_run_config, prepare_rollout_client_process

    p = argparse.ArgumentParser(description="areal rollout driver (inference-only runs)")
    p.add_argument("--config", required=True, help="the run's resolved config.yaml")
    args = p.parse_args(argv)
    setup_process_logging()
    cfg = load_run_config(args.config)
    if not prepare_rollout_client_process(cfg, "the rollout driver"):
        return 1
    drive(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
