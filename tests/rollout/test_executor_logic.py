"""Executor logic (admission, staleness bound, errors, ordering) with an in-process stand-in engine.

The stand-in only holds a version: these workflows never generate. Generation through real
servers is covered in test_executor_servers.py.
"""

import asyncio
import random
import threading
import time

import pytest
import torch

from areal.api.source import LoaderPosition
from areal.api.workflow import RolloutWorkflow
from areal.config.rollout import RolloutConfig
from areal.rollout.executor import RolloutError, RolloutExecutor
from areal.rollout.staleness import staleness_limit
from tests.serving import wait_for

HANG_GUARD_S = 60  # bounds below only stop a hang; none is what a test checks


class VersionOnly:
    """Just enough of an InferenceEngine for the executor: a version."""

    def __init__(self):
        self.version = 0

    def get_version(self):
        return self.version


class SleepyWorkflow(RolloutWorkflow):
    """Sleeps a random time and checks the bounds at the moment it starts."""

    def __init__(self, executor_ref, cfg, seed=0, drop_every=0):
        self.ref, self.cfg = executor_ref, cfg
        self.rng = random.Random(seed)
        self.violations, self.started = [], 0
        self.drop_every = drop_every
        self.lock = threading.Lock()

    async def arun_episode(self, engine, data):
        s = self.ref[0].stats()
        limit = staleness_limit(engine.get_version(), self.cfg.max_head_offpolicyness, self.cfg.consumer_batch_size)
        if s["running_bounded"] + s["accepted"] > limit or s["running"] > self.cfg.max_concurrent_rollouts:
            self.violations.append((s, engine.get_version()))
        with self.lock:
            self.started += 1
        await asyncio.sleep(self.rng.uniform(0.0, 0.02))
        if self.drop_every and data["i"] % self.drop_every == 0:
            return None
        return {"input_ids": torch.full((1, 1 + data["i"] % 3), data["i"]), "rewards": torch.tensor([1.0])}


def make(cfg):
    engine = VersionOnly()
    ex = RolloutExecutor(engine, cfg)
    return engine, ex


def count_admission_passes(ex):
    """Count the executor loop's admission passes; returns a function that waits for two more.
    The second began after the call, so whatever the loop may start by then, it has started:
    a check that nothing started needs no sleep."""
    passes = [0]
    changed = threading.Condition()
    admit = ex._admit

    def counted():
        try:
            return admit()
        finally:
            with changed:
                passes[0] += 1
                changed.notify_all()

    ex._admit = counted

    def two_more():
        with changed:
            target = passes[0] + 2
            assert changed.wait_for(lambda: passes[0] >= target, HANG_GUARD_S), "the loop stopped"

    return two_more


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_staleness_bound_under_random_concurrency(seed):
    rng = random.Random(seed)
    cfg = RolloutConfig(
        consumer_batch_size=rng.randint(2, 5),
        max_concurrent_rollouts=rng.randint(1, 8),
        max_head_offpolicyness=rng.randint(0, 2),
    )
    engine, ex = make(cfg)
    ref = [ex]
    wf = SleepyWorkflow(ref, cfg, seed=seed, drop_every=rng.choice([0, 4]))
    try:
        data = ({"i": i} for i in range(10**6))
        loader = [[next(data) for _ in range(cfg.consumer_batch_size)] for _ in range(50)]
        for step in range(6):
            batch = ex.prepare_batch(loader, wf)
            assert batch["rewards"].shape[0] == cfg.consumer_batch_size
            time.sleep(rng.uniform(0, 0.05))  # "training"
            engine.version += 1
        assert not wf.violations
        s = ex.stats()
        assert s["peak_running"] <= cfg.max_concurrent_rollouts
        assert s["peak_started"] <= staleness_limit(engine.version, cfg.max_head_offpolicyness, cfg.consumer_batch_size)
    finally:
        ex.destroy()


def test_synchronous_mode_blocks_until_the_version_moves():
    cfg = RolloutConfig(consumer_batch_size=2, max_concurrent_rollouts=8)
    engine, ex = make(cfg)
    wf = SleepyWorkflow([ex], cfg)
    try:
        for i in range(6):
            ex.submit({"i": i}, wf)
        ex.wait(2, timeout=HANG_GUARD_S)
        with pytest.raises(TimeoutError, match="only 0 of 2"):
            ex.wait(2, timeout=0.5)  # the timeout under test: none may arrive, however long
        assert wf.started == 2
        engine.version = 1
        ex.wait(2, timeout=HANG_GUARD_S)
        assert wf.started == 4
    finally:
        ex.destroy()


def test_a_recovered_run_keeps_the_staleness_bound_of_its_version():
    """Resumed at weight version 3 with 3 batches trained on, synchronous mode starts one batch
    at a time, as the interrupted run did at that version (counting from 0 it started 4 at once:
    samples 3 versions stale under max_head_offpolicyness=0)."""
    cfg = RolloutConfig(consumer_batch_size=2, max_concurrent_rollouts=8, max_head_offpolicyness=0)
    engine, ex = make(cfg)
    engine.version = 3
    wf = SleepyWorkflow([ex], cfg)
    two_more = count_admission_passes(ex)
    try:
        ex.count_trained_batches(3)
        for i in range(8):
            ex.submit({"i": i}, wf)
        ex.wait(2, timeout=HANG_GUARD_S)
        two_more()  # whatever the loop may start at version 3 has started
        assert wf.started == 2 and not wf.violations
        engine.version = 4
        ex.wait(2, timeout=HANG_GUARD_S)
        assert wf.started == 4 and not wf.violations
        with pytest.raises(RuntimeError, match="call it first"):
            ex.count_trained_batches(4)
    finally:
        ex.destroy()


def test_prepare_batch_says_why_it_waits_when_the_version_never_moves(caplog, monkeypatch):
    """A loop that never advances the version waits for ever in synchronous mode; after
    STALL_WARNING_S it is told so, with the key and the version, and it resumes once it moves."""
    import logging

    from areal.rollout import executor as executor_module

    monkeypatch.setattr(executor_module, "STALL_WARNING_S", 0.3)
    cfg = RolloutConfig(consumer_batch_size=2, max_concurrent_rollouts=2, max_head_offpolicyness=0)
    engine, ex = make(cfg)
    wf = SleepyWorkflow([ex], cfg)
    loader = [[{"i": i}, {"i": i + 1}] for i in range(0, 20, 2)]
    got = {}
    try:
        ex.prepare_batch(loader, wf)
        with caplog.at_level(logging.WARNING, logger=executor_module.logger.name):
            t = threading.Thread(target=lambda: got.setdefault("batch", ex.prepare_batch(loader, wf)))
            t.start()
            wait_for(
                lambda: any("max_head_offpolicyness=0" in r.getMessage() for r in caplog.records),
                "a warning about the held episodes",
                timeout=HANG_GUARD_S,
            )
            assert "batch" not in got and t.is_alive()
            message = next(r.getMessage() for r in caplog.records if "max_head_offpolicyness" in r.getMessage())
            assert "weight version 0" in message and "update_weights" in message
            engine.version = 1
            t.join(timeout=HANG_GUARD_S)
        assert got["batch"]["rewards"].shape == (2,)
    finally:
        ex.destroy()


def test_pause_stops_admission_until_resume():
    cfg = RolloutConfig(consumer_batch_size=4, max_concurrent_rollouts=4)
    engine, ex = make(cfg)
    wf = SleepyWorkflow([ex], cfg)
    passes = count_admission_passes(ex)
    try:
        ex.pause()
        for i in range(2):
            ex.submit({"i": i}, wf)
        passes()  # the loop has looked at both while paused
        assert wf.started == 0 and ex.stats()["queued"] == 2
        ex.resume()
        assert ex.wait(2, timeout=HANG_GUARD_S)["rewards"].shape == (2,)
    finally:
        ex.destroy()


class Gated(RolloutWorkflow):
    """Episodes that run until the test opens the gate."""

    def __init__(self):
        self.gate = threading.Event()

    async def arun_episode(self, engine, data):
        while not self.gate.is_set():
            await asyncio.sleep(0.001)
        return {"input_ids": torch.zeros(1, 1, dtype=torch.long), "rewards": torch.tensor([1.0])}


def test_bound_seconds_count_the_time_the_staleness_bound_holds_episodes_and_the_servers_idle():
    cfg = RolloutConfig(consumer_batch_size=2, max_concurrent_rollouts=8, max_head_offpolicyness=0)
    engine, ex = make(cfg)
    wf = Gated()
    passes = count_admission_passes(ex)
    try:
        for i in range(4):
            ex.submit({"i": i}, wf)
        passes()  # two run, two are held for version 1: held, but the servers have work
        before = ex.bound_seconds()
        passes()
        during = ex.bound_seconds()
        assert during["held_s"] > before["held_s"] and during["idle_s"] == before["idle_s"] == 0.0
        wf.gate.set()
        ex.wait(2, timeout=HANG_GUARD_S)
        passes()  # the first two finished; the others still wait for version 1: nothing runs
        before = ex.bound_seconds()
        passes()
        idle = ex.bound_seconds()
        assert idle["idle_s"] > before["idle_s"]
        assert idle["held_s"] - before["held_s"] >= idle["idle_s"] - before["idle_s"]
        engine.version = 1
        ex.wait(2, timeout=HANG_GUARD_S)
        passes()  # nothing queued: the bound holds nothing, whatever the time
        before = ex.bound_seconds()
        passes()
        assert ex.bound_seconds() == before
        ex.pause()  # a pause is not the bound's doing, queued episodes or not
        ex.submit({"i": 4}, wf)
        passes()
        before = ex.bound_seconds()
        passes()
        assert ex.bound_seconds() == before
    finally:
        ex.destroy()


class GatedEach(RolloutWorkflow):
    """Episode i runs until the test opens gate i."""

    def __init__(self, n):
        self.gates = [threading.Event() for _ in range(n)]

    async def arun_episode(self, engine, data):
        while not self.gates[data["i"]].is_set():
            await asyncio.sleep(0.001)
        return {"input_ids": torch.full((1, 1), data["i"]), "rewards": torch.tensor([1.0])}


def test_order_wait_counts_only_the_wait_for_an_older_episode_while_enough_had_finished():
    cfg = RolloutConfig(consumer_batch_size=2, max_concurrent_rollouts=4, max_head_offpolicyness=4)
    _, ex = make(cfg)
    wf = GatedEach(5)
    try:
        for i in range(5):
            ex.submit({"i": i}, wf)
        wf.gates[0].set()
        wf.gates[1].set()  # in order: a wait for generation, not for the order
        assert ex.wait(2, timeout=HANG_GUARD_S)["input_ids"][:, 0].tolist() == [0, 1]
        assert ex.order_wait_seconds() == 0.0
        wf.gates[3].set()
        wf.gates[4].set()  # two finished, but episode 2, older, runs on
        got = {}
        waiter = threading.Thread(target=lambda: got.update(ex.wait(2, timeout=HANG_GUARD_S)))
        waiter.start()
        wait_for(lambda: ex.stats()["ready"] == 2, "episodes 3 and 4 collected by the waiting call")
        assert waiter.is_alive()  # held for episode 2
        wf.gates[2].set()
        waiter.join(HANG_GUARD_S)
        assert got["input_ids"][:, 0].tolist() == [2, 3]
        assert ex.order_wait_seconds() > 0.0
    finally:
        ex.destroy()


class Failing(RolloutWorkflow):
    async def arun_episode(self, engine, data):
        if data["i"] == 3:
            raise ValueError("bad record")
        await asyncio.sleep(0.01)
        return {"x": torch.zeros(1, 1)}


def test_failure_surfaces_with_the_record():
    cfg = RolloutConfig(consumer_batch_size=8, max_concurrent_rollouts=8)
    _, ex = make(cfg)
    try:
        for i in range(5):
            ex.submit({"i": i}, Failing())
        with pytest.raises(RolloutError, match=r"Failing failed on record \{'i': 3\}: ValueError: bad record") as e:
            ex.wait(5, timeout=HANG_GUARD_S)
        assert e.value.data == {"i": 3}
        assert isinstance(e.value.__cause__, ValueError)
        with pytest.raises(RolloutError):
            ex.rollout_batch([{"i": 3}], Failing())
    finally:
        ex.destroy()


def test_rollout_batch_keeps_input_order_and_ignores_the_staleness_bound():
    cfg = RolloutConfig(consumer_batch_size=1, max_concurrent_rollouts=3)
    engine, ex = make(cfg)
    wf = SleepyWorkflow([ex], cfg, drop_every=5)
    try:
        batch = ex.rollout_batch([{"i": i} for i in range(1, 12)], wf)
        assert batch["input_ids"][:, 0].tolist() == [1, 2, 3, 4, 6, 7, 8, 9, 11]  # 5 and 10 dropped
        assert ex.stats()["peak_running"] <= 3
        assert ex.stats()["accepted"] == 0  # not counted against the bound
    finally:
        ex.destroy()


def test_should_accept_filters():
    cfg = RolloutConfig(consumer_batch_size=2, max_concurrent_rollouts=4)
    _, ex = make(cfg)
    wf = SleepyWorkflow([ex], cfg)
    try:
        batch = ex.rollout_batch(
            [{"i": i} for i in range(4)], wf, should_accept=lambda t: int(t["input_ids"][0, 0]) % 2 == 0
        )
        assert batch["input_ids"][:, 0].tolist() == [0, 2]
    finally:
        ex.destroy()


def test_destroy_cancels_and_rejects_new_work():
    cfg = RolloutConfig(consumer_batch_size=2, max_concurrent_rollouts=2)

    class Forever(RolloutWorkflow):
        def __init__(self):
            self.started, self.cancelled = threading.Event(), threading.Event()

        async def arun_episode(self, engine, data):
            self.started.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.cancelled.set()
                raise

    _, ex = make(cfg)
    forever = Forever()
    ex.submit({}, forever)
    assert forever.started.wait(HANG_GUARD_S)  # running, not only queued
    ex.destroy()
    # cancelled, not waited for: destroy gives the loop 30 s, far less than the episode's hour
    assert forever.cancelled.is_set()
    with pytest.raises(RuntimeError, match="destroyed"):
        ex.submit({}, Forever())


class Counting(RolloutWorkflow):
    """Every episode takes the same time (fixed-length generation) and counts its start."""

    def __init__(self):
        self.started = 0

    async def arun_episode(self, engine, data):
        self.started += 1
        await asyncio.sleep(0.05)
        return {"input_ids": torch.zeros(1, 1, dtype=torch.long), "rewards": torch.tensor([1.0])}


@pytest.mark.parametrize("offpolicyness", [0, 1])
def test_prepare_batch_keeps_the_next_batch_generating_while_the_trainer_trains(offpolicyness):
    """Episodes that all finish together must not leave the servers idle until the next call:
    in async RL the next batch runs during training; in sync RL it waits for the new version."""
    cfg = RolloutConfig(consumer_batch_size=4, max_concurrent_rollouts=4, max_head_offpolicyness=offpolicyness)
    engine, ex = make(cfg)
    wf = Counting()
    loader = [[{"i": i}] * 4 for i in range(10)]
    passes = count_admission_passes(ex)
    try:
        ex.prepare_batch(loader, wf)
        # "training", with no prepare_batch call: async, the next batch starts meanwhile; sync, the
        # loop looks at it and holds it for the new version
        if offpolicyness:
            wait_for(lambda: wf.started == 8, lambda: f"the next batch started: {wf.started}", timeout=HANG_GUARD_S)
        else:
            passes()
        assert wf.started == (8 if offpolicyness else 4)
        engine.version += 1
        ex.prepare_batch(loader, wf)
        assert ex.stats()["peak_running"] <= 4
    finally:
        ex.destroy()


def test_rollout_batch_passes_episodes_waiting_for_a_newer_version():
    """An evaluation (rollout_batch) between prepare_batch calls must not queue behind episodes
    that the staleness bound holds back until the next version."""
    cfg = RolloutConfig(consumer_batch_size=4, max_concurrent_rollouts=8, max_head_offpolicyness=0)
    engine, ex = make(cfg)
    wf = Counting()
    loader = [[{"i": i}] * 4 for i in range(10)]
    try:
        ex.prepare_batch(loader, wf)
        assert ex.stats()["queued"] > 0  # the next batch waits for version 1
        done = []
        t = threading.Thread(target=lambda: done.append(ex.rollout_batch([{"i": 0}] * 3, wf)), daemon=True)
        t.start()
        t.join(HANG_GUARD_S)
        assert done and done[0]["rewards"].shape == (3,)
        assert ex.stats()["queued"] > 0 and ex.stats()["accepted"] == 4  # the bound still holds
    finally:
        ex.destroy()


class StartVersion(RolloutWorkflow):
    """Records the version each episode started under; a few episodes take 15x longer (long
    answers), which is what let completion-order consumption train on staler samples."""

    def __init__(self, seed=0):
        self.rng = random.Random(seed)

    async def arun_episode(self, engine, data):
        version = engine.get_version()
        await asyncio.sleep(0.15 if self.rng.random() < 0.2 else 0.01)
        return {
            "input_ids": torch.zeros(1, 1, dtype=torch.long),
            "rewards": torch.tensor([1.0]),
            "versions": torch.tensor([[version]]),
            "order": torch.tensor([data["i"]]),
        }


@pytest.mark.parametrize("offpolicyness, seed", [(0, 0), (1, 1), (1, 2), (2, 3)])
def test_every_trained_sample_is_within_the_staleness_bound(offpolicyness, seed):
    """Per sample, not on average: the trainer at version v gets no episode started before
    v - max_head_offpolicyness, even when long episodes finish after younger ones."""
    cfg = RolloutConfig(consumer_batch_size=4, max_concurrent_rollouts=12, max_head_offpolicyness=offpolicyness)
    engine, ex = make(cfg)
    wf = StartVersion(seed)
    loader = [[{"i": 4 * b + j} for j in range(4)] for b in range(100)]
    worst, order = 0, []
    try:
        for _ in range(12):
            batch = ex.prepare_batch(loader, wf)
            worst = max(worst, engine.version - int(batch["versions"].min()))
            order.extend(batch["order"].tolist())
            time.sleep(0.01)  # "training"
            engine.version += 1
    finally:
        ex.destroy()
    assert worst <= offpolicyness
    assert order == sorted(order)  # episodes reach the trainer in submission order


class Ordered(RolloutWorkflow):
    """Returns the record's index; random short durations, every 5th record dropped."""

    def __init__(self, seed=0):
        self.rng = random.Random(seed)

    async def arun_episode(self, engine, data):
        await asyncio.sleep(self.rng.uniform(0.0, 0.03))
        if data["i"] % 5 == 4:
            return None
        return {
            "input_ids": torch.zeros(1, 1, dtype=torch.long),
            "rewards": torch.tensor([1.0]),
            "order": torch.tensor([data["i"]]),
        }


def test_resume_state_restarts_at_the_first_record_not_trained_on():
    """A recovered run must neither skip the prompts that were queued or running at the
    checkpoint (the loader had run ahead by them) nor repeat the ones trained on: three pieces
    resumed from resume_state() give the uninterrupted stream, across a mid-batch offset and an
    epoch boundary. Every row carries its record's dataset index (record_id, for prompts.jsonl)."""
    from areal.trainer.data import PromptLoader

    records = [{"i": i} for i in range(20)]  # 5 loader batches of 4 per epoch
    cfg = RolloutConfig(consumer_batch_size=3, max_concurrent_rollouts=5, max_head_offpolicyness=1)

    def train(loader, steps, seed):
        engine, ex = make(cfg)
        got = []
        try:
            for _ in range(steps):
                batch = ex.prepare_batch(loader, Ordered(seed))
                assert batch["record_id"].tolist() == batch["order"].tolist()  # each row's dataset index
                got += batch["order"].tolist()
                engine.version += 1
            return got, ex.resume_state()
        finally:
            ex.destroy()

    def loader(state=None):
        lo = PromptLoader(records, 4, seed=5)
        if state is not None:
            lo.load_state_dict(state.as_dict())
        return lo

    full, _ = train(loader(), 10, seed=0)
    ahead = loader()
    first, state = train(ahead, 3, seed=1)
    assert state == LoaderPosition(epoch=0, position=3, offset=0)
    assert ahead.state_dict()["position"] > 3  # the loader itself ran ahead by the backlog
    second, state2 = train(loader(state), 3, seed=2)
    assert state2 == LoaderPosition(epoch=1, position=0, offset=2)  # mid-batch, next epoch
    third, _ = train(loader(state2), 4, seed=3)
    assert first + second + third == full
    assert len(full) == 30 and not any(i % 5 == 4 for i in full)
