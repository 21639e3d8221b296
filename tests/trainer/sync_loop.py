"""The synchronous GRPO loop that tests/trainer/test_sync_equals_async.py compares the
asynchronous one with: each step generates exactly the dataloader's next batch through
RolloutExecutor.rollout_batch (nothing is generated ahead, no staleness bound is involved), then
trains and updates the weights, with the trainer, engine, workflow and server that
`python -m areal.trainer.main` builds from the same config. Only where the batch comes from
differs: areal.trainer.main asks the executor's prepare_batch, which keeps the next batches
queued and admits them as the staleness bound (rollout.max_head_offpolicyness) allows.

    python -m tests.trainer.sync_loop --config RUN/config.yaml
"""

from __future__ import annotations

import argparse
import sys
import types


def synchronous_next_batch(source):
    """A LiveRollouts.next_batch that generates the loader's next batch and nothing else."""
    import torch

    from areal.rollout.seeds import mix
    from areal.trainer.sources import broadcast_from_rank0

    batches = _cycle(source.loader) if source.engine is not None else None

    def next_batch(self):
        batch = None
        if self.engine is not None:
            records = next(batches)
            # the seeds prepare_batch gives these records: from their place in the data stream
            place = (self.loader.seed, self.loader.epoch, self.loader.position - 1)
            seeds = [mix(*place, offset) for offset in range(len(records))]
            batch = self.engine.executor.rollout_batch(records, self.workflow, seeds=seeds)
            n = self.cfg.gconfig.n_samples
            ids = [self.loader.record_id(r) for r in records]
            batch["record_id"] = torch.tensor(ids, dtype=torch.long).repeat_interleave(n)
        batch = broadcast_from_rank0(batch)
        self.time_share.to_trainer()
        return batch

    return types.MethodType(next_batch, source)


def _cycle(loader):
    while True:
        yield from loader


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True)
    args = p.parse_args(argv)
    from areal.infra.log_format import setup_process_logging
    from areal.trainer.grpo import train
    from areal.trainer.main import build_context, load_run_config, resolve_model_paths

    setup_process_logging(stream=sys.stderr)
    cfg = load_run_config(args.config)
    resolve_model_paths(cfg)
    ctx = build_context(cfg)
    ctx.source.next_batch = synchronous_next_batch(ctx.source)
    try:
        train(ctx)
    finally:
        ctx.close()
        ctx.actor.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
