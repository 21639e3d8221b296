"""Dynamic sampling in the executor: rejected groups are replaced, counted per batch, bounded by
rollout.max_overgeneration, and leave the staleness bound and the recovery position exact."""

import asyncio
import logging
import random

import pytest
import torch

from areal.algo.dynamic_sampling import has_reward_variance
from areal.api.workflow import RolloutWorkflow
from areal.config.rollout import RolloutConfig
from areal.rollout import executor as executor_module
from areal.rollout.executor import RolloutExecutor
from areal.rollout.staleness import staleness_limit


class VersionOnly:
    def __init__(self):
        self.version = 0

    def get_version(self):
        return self.version


class Groups(RolloutWorkflow):
    """A group of `n` answers per record: all-equal rewards when `flat(i)`, else 0 and 1s.
    Random short durations; records the version each episode started under."""

    def __init__(self, flat, n=2, seed=0):
        self.flat, self.n, self.rng = flat, n, random.Random(seed)
        self.started = []

    async def arun_episode(self, engine, data):
        i = data["i"]
        self.started.append(i)
        version = engine.get_version()
        await asyncio.sleep(self.rng.uniform(0.0, 0.02))
        rewards = torch.ones(self.n) if self.flat(i) else torch.tensor([float(k % 2) for k in range(self.n)])
        return {
            "input_ids": torch.full((self.n, 1), i),
            "rewards": rewards,
            "versions": torch.full((self.n, 1), version),
        }


def records(n_batches, size):
    return [[{"i": size * b + j} for j in range(size)] for b in range(n_batches)]


def test_zero_variance_groups_are_replaced_and_counted_per_batch():
    # every third record (0, 3, 6, ...) gives equal rewards; batches of 2 groups of 3 answers:
    # batch 1 is records 1, 2 (0 dropped before them), batch 2 is 4, 5 (3 dropped), ...
    cfg = RolloutConfig(consumer_batch_size=2, max_concurrent_rollouts=4, max_head_offpolicyness=0)
    engine = VersionOnly()
    ex = RolloutExecutor(engine, cfg)
    wf = Groups(lambda i: i % 3 == 0, n=3)
    loader = records(40, 2)
    try:
        for step in range(4):
            batch = ex.prepare_batch(loader, wf, has_reward_variance)
            got = batch["input_ids"][::3, 0].tolist()
            assert got == [3 * step + 1, 3 * step + 2]
            assert ex.last_batch_stats() == {
                "groups": 2,
                "dropped_groups": 1,
                "dropped_samples": 3,
                "kept_past_limit": 0,
            }
            engine.version += 1
        assert ex.stats()["accepted"] == 8  # dropped groups never count as accepted
    finally:
        ex.destroy()


@pytest.mark.parametrize("offpolicyness, seed", [(0, 0), (1, 1), (2, 2)])
def test_staleness_bound_holds_for_every_sample_with_dropped_groups(offpolicyness, seed):
    rng = random.Random(seed)
    flat = {i for i in range(2000) if rng.random() < 0.4}
    cfg = RolloutConfig(consumer_batch_size=4, max_concurrent_rollouts=6, max_head_offpolicyness=offpolicyness)
    engine = VersionOnly()
    ex = RolloutExecutor(engine, cfg)
    wf = Groups(lambda i: i in flat, seed=seed)
    order, dropped, loader = [], 0, records(500, 4)
    try:
        for _ in range(8):
            batch = ex.prepare_batch(loader, wf, has_reward_variance)
            assert batch["rewards"].shape == (8,)
            assert engine.version - int(batch["versions"].min()) <= offpolicyness
            order += batch["input_ids"][::2, 0].tolist()
            dropped += ex.last_batch_stats()["dropped_groups"]
            engine.version += 1
        s = ex.stats()
        assert s["peak_started"] <= staleness_limit(engine.version, offpolicyness, 4)
    finally:
        ex.destroy()
    # in submission order, none with equal rewards, and every record before the last trained one
    # was either trained on or dropped (and counted once)
    assert order == sorted(order) and not flat & set(order)
    assert len(order) + dropped == order[-1] + 1


def test_overgeneration_bound_keeps_groups_past_it_and_warns(caplog):
    # every group has equal rewards; at most 1.0 x 2 = 2 are dropped per batch: one episode at a
    # time, records 0 and 1 are dropped, 2 and 3 kept past the bound; then 4, 5 dropped, 6, 7 kept
    cfg = RolloutConfig(consumer_batch_size=2, max_concurrent_rollouts=1, max_overgeneration=1.0)
    engine = VersionOnly()
    ex = RolloutExecutor(engine, cfg)
    wf, loader = Groups(lambda i: True), records(40, 2)
    try:
        with caplog.at_level(logging.WARNING, logger=executor_module.logger.name):
            for step in range(2):
                batch = ex.prepare_batch(loader, wf, has_reward_variance)
                assert batch["input_ids"][::2, 0].tolist() == [4 * step + 2, 4 * step + 3]
                assert ex.last_batch_stats() == {
                    "groups": 2,
                    "dropped_groups": 2,
                    "dropped_samples": 4,
                    "kept_past_limit": 2,
                }
                engine.version += 1
        warnings = [r.getMessage() for r in caplog.records if "rollout.max_overgeneration" in r.getMessage()]
        assert len(warnings) == 2  # once per batch
        assert "rollout.max_overgeneration=1 x consumer_batch_size 2" in warnings[0]
    finally:
        ex.destroy()


def test_zero_overgeneration_keeps_every_group():
    cfg = RolloutConfig(consumer_batch_size=2, max_concurrent_rollouts=2, max_overgeneration=0)
    engine = VersionOnly()
    ex = RolloutExecutor(engine, cfg)
    try:
        batch = ex.prepare_batch(records(10, 2), Groups(lambda i: True), has_reward_variance)
        assert batch["input_ids"][::2, 0].tolist() == [0, 1]
        assert ex.last_batch_stats()["dropped_groups"] == 0
    finally:
        ex.destroy()


def test_resume_state_is_exact_with_dropped_groups():
    """As test_executor_logic's resume test, with the drops made by should_accept: a run resumed
    from resume_state() trains on exactly what the uninterrupted one would."""
    from areal.trainer.data import PromptLoader

    rows = [{"i": i} for i in range(20)]
    cfg = RolloutConfig(consumer_batch_size=3, max_concurrent_rollouts=5, max_head_offpolicyness=1)

    def train(loader, steps, seed):
        engine = VersionOnly()
        ex = RolloutExecutor(engine, cfg)
        got = []
        try:
            for _ in range(steps):
                got += ex.prepare_batch(loader, Groups(lambda i: i % 5 == 4, seed=seed), has_reward_variance)[
                    "input_ids"
                ][::2, 0].tolist()
                engine.version += 1
            return got, ex.resume_state()
        finally:
            ex.destroy()

    def loader(state=None):
        lo = PromptLoader(rows, 4, seed=5)
        if state is not None:
            lo.load_state_dict(state.as_dict())
        return lo

    full, _ = train(loader(), 10, seed=0)
    first, state = train(loader(), 3, seed=1)
    second, state2 = train(loader(state), 3, seed=2)
    third, _ = train(loader(state2), 4, seed=3)
    assert first + second + third == full
    assert len(full) == 30 and not any(i % 5 == 4 for i in full)
