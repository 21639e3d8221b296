"""Asynchronous RL at staleness 0 equals synchronous RL, bitwise (issue 30, item 4).

The asynchronous path is the trainer as areal-launch runs it (`python -m areal.trainer.main`):
its rollout executor's prepare_batch keeps the next batches queued and admits them as the
staleness bound allows, here rollout.max_head_offpolicyness=0. The synchronous path
(tests/trainer/sync_loop.py) generates exactly the dataloader's next batch with rollout_batch,
then trains and updates, with everything else the same. Both run 20 steps with the same seed,
each against its own real built-in server started alike; their losses per step and their final
weights must be equal bit for bit (verl #6780: theirs were not).

What makes it bitwise:
- sampling: each request carries a sampling_seed from its record's place in the data stream and
  its sample index (areal/rollout/seeds.py); the server draws from (seed, position) alone, so the
  tokens do not depend on which requests arrive together or in which order;
- the server's numbers: in a batched forward pass on CPU, a row's logits depend in their last
  bits on the rows padded and batched with it (reductions over other lengths, other blocking),
  and the server's logprobs enter the decoupled PPO loss. With seeds alone (server batching as
  usual, 8 prompts x 8 samples a step), the tokens and rewards were equal in all 20 steps, but
  the losses differed in 11-13 of them by up to 1.5e-8 (relative 9e-8, under one float32 ulp)
  and the final weights by up to 2.6e-7; two synchronous runs differed from each other as much
  as from the asynchronous one, so this is the server's batching, not the asynchronous path.
  The server therefore runs here with --max-running-requests 1: each sequence is computed alone
  and its logprobs depend on nothing else. (SGLang's counterpart is
  --enable-deterministic-inference, its batch-invariant kernels.)
- threads: one per process (OMP_NUM_THREADS=1, what the launcher gives on 2 cores), the same in
  both runs; the model has no dropout.

Until the client sends ModelRequest.sampling_seed (areal/api/inference.py, protocol.py) and the
RLVR workflow sets it (request_seed), the test skips.
"""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from areal.config import validate_config
from launcher.compose import compose

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
STEPS = 20
# one thread per process, as the launcher shares out 2 cores (launcher/procs.py): the same
# reductions in both runs whatever the machine, and no spinning threads on a busy one
ENV = {"OMP_NUM_THREADS": "1"}


def write_config(tmp_path, model, name, url):
    cfg = validate_config(
        compose(
            "tiny_arith_cpu",
            [
                f"actor.path={model}",
                f"cluster.fileroot={tmp_path}",
                f"trial_name={name}",
                "launcher.rollout_n_nodes=0",
                f"rollout.server_addrs=[{url.removeprefix('http://')}]",
                "rollout.max_head_offpolicyness=0",
                f"total_train_steps={STEPS}",
                "evaluator.freq_steps=null",
                "train_dataset.kwargs.size=64",
                "train_dataset.batch_size=4",
                "gconfig.n_samples=4",
                "actor.ppo_n_minibatches=2",
            ],
        )
    )
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump()))
    return cfg, path


def test_async_at_staleness_0_gives_the_sync_losses_and_weights_bitwise(tmp_path):
    import torch
    from safetensors.torch import load_file

    from areal.api.inference import ModelRequest
    from areal.models.resolve import TINY_PRESETS
    from areal.models.tiny import make_tiny_model_dir
    from tests.serving import start_server

    if "sampling_seed" not in ModelRequest.__dataclass_fields__:
        pytest.skip("the client does not send sampling_seed yet (ModelRequest.sampling_seed, protocol.py)")
    model = make_tiny_model_dir(tmp_path / "arith", **TINY_PRESETS["arith"])
    paths = {"sync": "tests.trainer.sync_loop", "async": "areal.trainer.main"}
    args = ["--dtype", "float32", "--weight-dirs", tmp_path, "--max-running-requests", "1"]
    servers, procs, runs = {}, {}, {}
    try:
        # one server per path (each run pushes its own weights), both runs at once: each is a
        # ping-pong between its trainer and its server, so together they keep 2 cores busy
        with ThreadPoolExecutor(2) as pool:
            starting = {name: pool.submit(start_server, model, extra_args=args, env=ENV) for name in paths}
            for name, future in starting.items():
                servers[name] = future.result()
        configs = {name: write_config(tmp_path, model, name, servers[name].url) for name in paths}
        for name, module in paths.items():
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", module, "--config", str(configs[name][1])],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                cwd=REPO,
                env={**os.environ, **ENV},
            )
        for name, proc in procs.items():
            _, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, f"{name}: {err[-3000:]}"
            run_dir = Path(configs[name][0].run_dir)
            rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            (weights,) = (run_dir / "models" / "final").glob("*.safetensors")
            runs[name] = rows, load_file(weights)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for server in servers.values():
            server.stop()

    (sync_rows, sync_w), (async_rows, async_w) = runs["sync"], runs["async"]
    assert [r["step"] for r in sync_rows] == [r["step"] for r in async_rows] == list(range(1, STEPS + 1))
    for key in ("rollout/reward_mean", "rollout/gen_tokens", "train/loss"):
        assert [r[key] for r in sync_rows] == [r[key] for r in async_rows], key
    assert sync_w.keys() == async_w.keys()
    assert all(torch.equal(sync_w[k], async_w[k]) for k in sync_w), "final weights differ"
    # not trivially equal: the runs learnt something, from groups whose rewards differed
    initial = load_file(next(Path(model).glob("*.safetensors")))
    assert any(not torch.equal(initial[k], sync_w[k]) for k in sync_w)
    assert any(r["rollout/reward_std"] > 0 for r in sync_rows)
    # at staleness 0 the next batch waits for each new version: the server idles while the trainer trains
    assert all(0 <= r["rollout/bound_idle_s"] <= r["rollout/bound_held_s"] + 1e-9 for r in async_rows)
    assert sum(r["rollout/bound_idle_s"] for r in async_rows) > 0
