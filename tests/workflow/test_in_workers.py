"""workflow.workers: RLVR episodes in worker processes (areal/workflow/in_workers.py), against a
real built-in server. With the same episode seeds they give the rows the same episodes give in the
trainer's process; the workers and their reward workers carry names `ps` shows and stop cleanly
on close(); a recipe that cannot travel is refused with the key that keeps the episodes
in-process."""

import asyncio
import gc
import os

import psutil
import pytest
import torch

from areal.api.workflow import RolloutWorkflow
from areal.config.pretrained_client import pretrained_client_config
from areal.rollout.seeds import mix
from areal.workflow.in_workers import WorkflowInWorkers
from areal.workflow.registry import build_workflow
from areal.workflow.rlvr import RLVRWorkflow
from tests.serving import served_engine

R = "tests.workflow.rewards:"
RECORDS = [{"question": "1+2="}, {"question": "3+4="}]
SEEDS = [mix(7, 0, 0, 0), mix(7, 0, 0, 1)]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    with served_engine(tiny_model_dir) as eng:
        yield eng


def rlvr_config(model_dir, engine, workers: int):
    return pretrained_client_config(
        model_dir,
        server_addrs=list(engine.addrs),
        gconfig={"n_samples": 3, "max_new_tokens": 6},
        workflow={"reward_fn": R + "n_tokens", "reward_workers": 1, "workers": workers},
    )


def test_rlvr_episodes_in_a_worker_give_the_in_process_rows(engine, tiny_model_dir):
    in_process = build_workflow(rlvr_config(tiny_model_dir, engine, 0), tiny_model_dir)
    in_workers = build_workflow(rlvr_config(tiny_model_dir, engine, 1), tiny_model_dir)
    assert isinstance(in_process, RLVRWorkflow) and isinstance(in_workers, WorkflowInWorkers)
    try:
        here = engine.executor.rollout_batch(RECORDS, in_process, seeds=SEEDS)
        there = engine.executor.rollout_batch(RECORDS, in_workers, seeds=SEEDS)
        pool = in_workers.pool
        assert len(pool.pids) == 1 and pool.pids[0] != os.getpid()
        for key in ("input_ids", "attention_mask", "loss_mask", "versions", "rewards"):
            assert torch.equal(here[key], there[key]), key
        assert torch.allclose(here["logprobs"], there["logprobs"], atol=1e-5)
        assert there["rewards"].tolist() == there["loss_mask"].sum(1).float().tolist()
        reward_pool = psutil.Process(pool.pids[0]).children()
        assert len(reward_pool) == 1  # workflow.reward_workers=1: the rewards were scored under the worker
        # what `ps` and the launcher's stopped-process error show (areal/utils/proc_name.py)
        assert psutil.Process(pool.pids[0]).name() == "areal-episodes" and reward_pool[0].name() == "areal-reward"
    finally:
        in_process.close()
        in_workers.close()
    assert pool.exit_codes() == [0]  # it closed its workflow and client and exited by itself
    assert pool not in engine.control._listeners
    _, alive = psutil.wait_procs(reward_pool, timeout=30)
    assert not alive, f"the worker's reward processes outlived it: {alive}"


def test_a_recipe_that_cannot_travel_is_refused_with_the_key():
    with pytest.raises(ValueError, match=r"cannot be sent there .*or set workflow.workers=0"):
        WorkflowInWorkers(lambda: None, 1)
    with pytest.raises(ValueError, match="workflow.workers=0: WorkflowInWorkers needs at least one"):
        WorkflowInWorkers(RLVRWorkflow, 0)


def test_training_episodes_go_to_workers_and_evaluations_stay_in_the_trainers_process():
    """The training thread waits while an evaluation runs, so its episodes take no GIL from
    training: a worker process would only add a start-up (areal/trainer/main.py _eval_parts)."""
    from areal.config import validate_config
    from areal.trainer.main import _eval_parts, resolve_model_paths
    from launcher.compose import compose

    cfg = validate_config(compose("tiny_arith_cpu.yaml", ["workflow.workers=1", "evaluator.freq_steps=5"]))
    resolve_model_paths(cfg)
    training = build_workflow(cfg, cfg.actor.tokenizer_path)
    records, evaluation = _eval_parts(cfg)
    try:
        assert isinstance(training, WorkflowInWorkers) and training.workers == 1
        assert isinstance(evaluation, RLVRWorkflow) and records
    finally:
        training.close()
        evaluation.close()


def test_a_failed_episode_names_the_workflow_the_workers_run(engine, tiny_model_dir):
    from areal.rollout.executor import RolloutError

    in_workers = build_workflow(rlvr_config(tiny_model_dir, engine, 1), tiny_model_dir)
    try:
        with pytest.raises(RolloutError, match=r"workflow RLVRWorkflow in workflow.workers=1 processes failed"):
            engine.executor.rollout_batch([{"not_a_prompt": 1}], in_workers, seeds=SEEDS[:1])
    finally:
        in_workers.close()


class ReportsItsProcess(RolloutWorkflow):
    """An episode that answers with the worker's pid and how many objects it has frozen."""

    async def arun_episode(self, engine, data):
        return {"pid": os.getpid(), "frozen": gc.get_freeze_count()}


def test_a_worker_freezes_what_it_built_before_its_first_episode(engine):
    """Its full collections then skip the client, the workflow and their libraries: without the
    freeze each stalled the worker's event loop about 0.13 s (320k objects tracked, 2 cores)."""
    in_workers = WorkflowInWorkers(ReportsItsProcess, 1)
    try:
        answer = asyncio.run(in_workers.arun_episode(engine, {}))
    finally:
        in_workers.close()
    assert answer["pid"] != os.getpid()
    assert answer["frozen"] > 10_000  # the imported libraries at least (about 200k here)
