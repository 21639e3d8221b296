"""Episode seeds (areal/rollout/seeds.py): an episode's sampling seed comes from its record's place
in the data stream, so prepare_batch (running ahead under the staleness bound) and rollout_batch
(exactly these records) give a record the same seed, and the seeds of a group's requests differ."""

import itertools

import pytest
import torch

from areal.api.workflow import RolloutWorkflow
from areal.config.rollout import RolloutConfig
from areal.rollout.executor import RolloutExecutor
from areal.rollout.seeds import episode_seed, mix, request_seed
from areal.trainer.data import PromptLoader


class VersionOnly:
    """Just enough of an InferenceEngine for the executor: a version (nothing is generated)."""

    version = 0

    def get_version(self):
        return self.version


class SeedWorkflow(RolloutWorkflow):
    """Returns the seeds its requests would carry: the episode's and its first two requests'."""

    async def arun_episode(self, engine, data):
        seeds = [-1 if s is None else s for s in (episode_seed(), request_seed(0), request_seed(1))]
        return {"input_ids": torch.tensor([[data["i"]]]), "seeds": torch.tensor([seeds], dtype=torch.int64)}


def test_prepare_batch_and_rollout_batch_give_a_record_the_same_seeds():
    cfg = RolloutConfig(consumer_batch_size=4, max_concurrent_rollouts=4, max_head_offpolicyness=0)
    records = [{"i": i} for i in range(12)]
    engine, workflow = VersionOnly(), SeedWorkflow()
    ahead = RolloutExecutor(engine, cfg)
    loader = PromptLoader(records, 4, seed=7)
    try:
        async_batches = []
        for version in range(1, 5):  # past an epoch: the same records again, other seeds
            async_batches.append(ahead.prepare_batch(loader, workflow))
            engine.version = version
    finally:
        ahead.destroy()

    sync = RolloutExecutor(VersionOnly(), cfg)
    loader = PromptLoader(records, 4, seed=7)
    try:
        sync_batches = []
        epochs = itertools.chain.from_iterable(loader for _ in range(2))
        for _ in range(4):
            batch = next(epochs)
            place = (loader.seed, loader.epoch, loader.position - 1)
            seeds = [mix(*place, offset) for offset in range(len(batch))]
            sync_batches.append(sync.rollout_batch(batch, workflow, seeds=seeds))
    finally:
        sync.destroy()
    for a, s in zip(async_batches, sync_batches):
        assert torch.equal(a["input_ids"], s["input_ids"]) and torch.equal(a["seeds"], s["seeds"])
    seeds = torch.cat([b["seeds"] for b in async_batches])
    assert seeds.unique().numel() == seeds.numel()  # per episode, per request, per epoch
    assert int(seeds[0, 0]) == mix(7, 0, 0, 0)


def test_no_seed_outside_an_episode_and_rollout_batch_checks_the_seed_count():
    assert episode_seed() is None and request_seed(0) is None
    ex = RolloutExecutor(VersionOnly(), RolloutConfig(consumer_batch_size=2))
    try:
        batch = ex.rollout_batch([{"i": 0}], SeedWorkflow())
        assert batch["seeds"].tolist() == [[-1, -1, -1]]  # no seeds given: the servers' generators
        with pytest.raises(ValueError):
            ex.rollout_batch([{"i": 0}, {"i": 1}], SeedWorkflow(), seeds=[1])
    finally:
        ex.destroy()
