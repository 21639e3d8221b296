"""The executor driving real generation (one built-in server): the staleness bound under
randomised concurrency, with a pause + disk weight update + resume between training steps."""

import random
import threading
import time

import pytest
import torch

from areal.api.inference import ModelRequest
from areal.api.weights import WeightUpdateMeta
from areal.api.workflow import RolloutWorkflow
from areal.engine.sglang.client import RemoteSGLangEngine
from areal.rollout.staleness import staleness_limit
from tests.serving import start_server


class RandomLengthGeneration(RolloutWorkflow):
    """One generation of random length; records any bound violation seen when it starts."""

    def __init__(self, engine, seed):
        self.engine = engine
        self.rng = random.Random(seed)
        self.violations = []
        self.lock = threading.Lock()

    async def arun_episode(self, engine, data):
        ex, r = self.engine.executor, self.engine.config.rollout
        s = ex.stats()
        limit = staleness_limit(engine.get_version(), r.max_head_offpolicyness, r.consumer_batch_size)
        if s["running_bounded"] + s["accepted"] > limit or s["running"] > r.max_concurrent_rollouts:
            self.violations.append(s)
        with self.lock:
            n = self.rng.randint(1, 24)
        resp = await engine.agenerate(ModelRequest(input_ids=[1] + data["ids"], max_new_tokens=n, ignore_eos=True))
        assert resp.output_len == n
        return {
            "input_ids": torch.tensor([resp.input_tokens + resp.output_tokens]),
            "versions": torch.tensor([[-1] * resp.input_len + resp.output_versions]),
            "rewards": torch.tensor([float(n)]),
        }


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    handle = start_server(tiny_model_dir, extra_args=["--dtype", "float32"], env={"OMP_NUM_THREADS": "1"})
    yield handle
    handle.stop()


@pytest.mark.parametrize("seed", [0, 1])
def test_staleness_bound_with_real_generation(server, tiny_model_dir, seed):
    rng = random.Random(seed)
    bs, conc, ofp = rng.randint(2, 4), rng.randint(2, 6), rng.randint(0, 2)
    engine = RemoteSGLangEngine.from_pretrained(
        tiny_model_dir,
        server_addrs=[server.url],
        max_concurrent_rollouts=conc,
        rollout={"consumer_batch_size": bs, "max_head_offpolicyness": ofp},
    )
    engine.control.update_weights(WeightUpdateMeta("disk", path=tiny_model_dir, version=0))  # a fresh run
    wf = RandomLengthGeneration(engine, seed)
    loader = [[{"ids": [rng.randint(3, 40) for _ in range(3)]} for _ in range(bs)] for _ in range(4)]
    try:
        for step in range(4):
            batch = engine.prepare_batch(loader, wf)
            assert batch["rewards"].shape == (bs,)
            gen = batch["versions"] >= 0
            assert gen.sum(1).float().tolist() == batch["rewards"].tolist()  # nothing lost on pause
            assert int(batch["versions"].max()) <= step
            time.sleep(rng.uniform(0, 0.2))  # training
            engine.control.update_weights(WeightUpdateMeta("disk", path=tiny_model_dir, version=step + 1))
        assert not wf.violations
        s = engine.executor.stats()
        assert s["peak_running"] <= conc
        assert s["peak_started"] <= staleness_limit(engine.get_version(), ofp, bs)
    finally:
        engine.destroy()
