"""RLVR and multi-turn workflows against a real built-in server: masks, logprobs, versions, rewards."""

import pytest
import torch

from areal.config.rollout import GenerationConfig, RolloutConfig
from areal.rollout.executor import RolloutExecutor
from areal.workflow.common import chat_prompt_ids, encode, load_tokenizer
from areal.workflow.multi_turn import MultiTurnWorkflow
from areal.workflow.registry import build_workflow, resolve_workflow_class
from areal.workflow.rlvr import RLVRWorkflow
from tests.serving import served_engine, wait_for

R = "tests.workflow.rewards:"
RECORD = {"question": "1+2=", "answer": "1+2=3\n#### 3", "solution": "3", "prompt": "not a prompt"}


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    with served_engine(tiny_model_dir) as eng:
        yield eng


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


def gconfig(**kw):
    return GenerationConfig(**{"n_samples": 3, "max_new_tokens": 6, **kw})


def check_rows(batch, prompt_ids, n):
    """Prompt first (loss 0, logprob 0, version -1), then generated tokens (loss 1), then padding."""
    p = len(prompt_ids)
    assert batch["input_ids"].shape[0] == n
    for i in range(n):
        length = int(batch["attention_mask"][i].sum())
        assert batch["attention_mask"][i, :length].eq(1).all() and batch["attention_mask"][i, length:].eq(0).all()
        assert batch["input_ids"][i, :p].tolist() == prompt_ids
        assert batch["loss_mask"][i, :p].eq(0).all() and batch["loss_mask"][i, length:].eq(0).all()
        assert batch["logprobs"][i, :p].eq(0).all() and batch["versions"][i, :p].eq(-1).all()
    return p


def test_rlvr_trajectory(engine, tokenizer):
    wf = RLVRWorkflow(R + "n_tokens", gconfig(), tokenizer, reward_workers=1)
    try:
        batch = engine.rollout_batch([RECORD], wf)
    finally:
        wf.close()
    prompt_ids = chat_prompt_ids(tokenizer, [{"role": "user", "content": "1+2="}])
    p = check_rows(batch, prompt_ids, 3)
    gen = batch["loss_mask"].bool()
    lengths = batch["attention_mask"].sum(1)
    assert gen.sum(1).tolist() == (lengths - p).tolist()
    assert (batch["logprobs"][gen] <= 0).all() and (batch["logprobs"][gen] < 0).any()
    assert batch["versions"][gen].eq(0).all()
    assert batch["rewards"].tolist() == gen.sum(1).float().tolist()
    assert batch["rewards"].dtype == torch.float32


def test_reward_gets_prompt_text_and_record_fields(engine, tokenizer):
    wf = RLVRWorkflow(R + "checks_fields", gconfig(n_samples=2), tokenizer, reward_workers=1)
    try:
        assert engine.rollout_batch([RECORD], wf)["rewards"].tolist() == [1.0, 1.0]
    finally:
        wf.close()


def test_multi_turn_retries_with_feedback_and_discount(engine, tokenizer):
    feedback = "wrong try again"
    wf = MultiTurnWorkflow(
        R + "always_minus_one",
        gconfig(n_samples=2, max_new_tokens=4),
        tokenizer,
        max_turns=3,
        turn_discount=0.5,
        feedback=feedback,
        reward_workers=1,
    )
    try:
        batch = engine.rollout_batch([RECORD], wf)
    finally:
        wf.close()
    prompt_ids = chat_prompt_ids(tokenizer, [{"role": "user", "content": "1+2="}])
    check_rows(batch, prompt_ids, 2)
    assert batch["rewards"].tolist() == [-0.25, -0.25]  # -1 * 0.5 ** 2 retries
    fb = encode(tokenizer, feedback)
    for i in range(2):
        mask = batch["loss_mask"][i].tolist()
        runs = _runs(mask[len(prompt_ids) : int(batch["attention_mask"][i].sum())])
        assert [v for v, _ in runs] == [1, 0, 1, 0, 1]  # three answers, two feedback messages
        assert [n for v, n in runs if v == 0] == [len(fb), len(fb)]
        ids = batch["input_ids"][i].tolist()
        start = len(prompt_ids) + runs[0][1]
        assert ids[start : start + len(fb)] == fb
        gen = batch["loss_mask"][i].bool()
        assert batch["versions"][i][gen].eq(0).all() and batch["versions"][i][~gen].eq(-1).all()
        assert batch["logprobs"][i][~gen].eq(0).all()


def test_multi_turn_first_turn_success_gets_full_reward(engine, tokenizer):
    wf = MultiTurnWorkflow(
        R + "always_one",
        gconfig(n_samples=2, max_new_tokens=4),
        tokenizer,
        max_turns=3,
        turn_discount=0.5,
        reward_workers=1,
    )
    try:
        batch = engine.rollout_batch([RECORD], wf)
    finally:
        wf.close()
    assert batch["rewards"].tolist() == [1.0, 1.0]
    p = len(chat_prompt_ids(tokenizer, [{"role": "user", "content": "1+2="}]))
    for i in range(2):
        length = int(batch["attention_mask"][i].sum())
        assert batch["loss_mask"][i, p:length].eq(1).all()


def test_hanging_reward_times_out_without_stalling_the_executor(engine, tokenizer, tmp_path):
    executor = RolloutExecutor(engine, RolloutConfig(consumer_batch_size=1, max_concurrent_rollouts=4))
    # 8 s: far longer than the other episodes take, which must finish while the reward hangs
    hung = RLVRWorkflow(R + "hang", gconfig(n_samples=1), tokenizer, reward_timeout_s=8, reward_workers=1)
    fine = RLVRWorkflow(R + "always_one", gconfig(n_samples=1), tokenizer, reward_workers=1)
    hanging = tmp_path / "hanging"
    try:
        fine_batch = executor.rollout_batch([RECORD], fine)  # warm the pool
        executor.submit({**RECORD, "marker": str(hanging)}, hung)
        wait_for(hanging.exists, "the hung reward began", timeout=120)
        fine_batch = executor.rollout_batch([RECORD, RECORD], fine)
        assert executor.stats()["running"] == 1, "a hung reward held up other episodes"  # still hung
        assert fine_batch["rewards"].tolist() == [1.0, 1.0]
        hung_batch = executor.wait(1, timeout=60)
        assert hung_batch["rewards"].tolist() == [0.0]
    finally:
        executor.destroy()
        hung.close()
        fine.close()


def test_registry(tiny_model_dir):
    from areal.config.pretrained_client import pretrained_client_config

    assert resolve_workflow_class("rlvr") is RLVRWorkflow
    assert resolve_workflow_class("areal.workflow.multi_turn:MultiTurnWorkflow") is MultiTurnWorkflow
    with pytest.raises(ValueError, match="workflow.type='rlvx'"):
        resolve_workflow_class("rlvx")
    with pytest.raises(TypeError, match="not a subclass"):
        resolve_workflow_class("areal.workflow.common:load_tokenizer")
    cfg = pretrained_client_config(
        tiny_model_dir,
        server_addrs=["h:1"],
        workflow={"type": "multi_turn", "max_turns": 4, "reward_fn": "arith_exact", "kwargs": {"feedback": "again"}},
    )
    wf = build_workflow(cfg, tiny_model_dir)
    assert isinstance(wf, MultiTurnWorkflow) and wf.max_turns == 4 and wf.feedback == "again"
    wf.close()


def _runs(values):
    runs = []
    for v in values:
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([v, 1])
    return [tuple(r) for r in runs]


def test_score_all_calls_a_runner_without_score_many_one_call_each():
    import asyncio

    from areal.workflow.common import score_all

    async def reward(prompt, completion, prompt_ids, completion_ids, bonus=0.0):
        return len(completion) + bonus

    calls = [(("p", "x" * i, [], []), {"bonus": 0.5}) for i in range(4)]
    assert asyncio.run(score_all(reward, calls)) == [0.5, 1.5, 2.5, 3.5]
