"""The agent workflow through the rollout executor, against a built-in server with the scripted
chat model: rows for both sample modes (masks, logprobs, versions, rewards), the per-step figures,
and what a misbehaving agent gets."""

import pytest

from areal.config import validate_config
from areal.config.rollout import GenerationConfig
from areal.rollout.batch import sample_stats
from areal.rollout.executor import RolloutError
from areal.workflow.agent import AgentWorkflow
from areal.workflow.registry import build_workflow
from tests.scripted_chat import CALL_TEXT, END

A = "tests.workflow.agents:"
RECORD = {"question": "add 3 and 4", "bonus": 0.25}


@pytest.fixture(scope="module")
def engine(scripted_chat_engine):
    return scripted_chat_engine


def workflow(model_dir, run, **kw):
    """The agents run in this process unless a test asks for worker processes (workers=1)."""
    kw.setdefault("workers", 0)
    return AgentWorkflow(A + run, GenerationConfig(n_samples=2, max_new_tokens=128, temperature=0.0), model_dir, **kw)


@pytest.mark.parametrize("workers", [0, 1])
def test_conversation_rows(engine, scripted_chat_model_dir, workers):
    wf = workflow(scripted_chat_model_dir, "calculator", workers=workers)
    try:
        batch = engine.rollout_batch([RECORD], wf)
    finally:
        wf.close()
    tok = wf.tokenizer
    assert batch["input_ids"].shape[0] == 2 and batch["rewards"].tolist() == [1.25, 1.25]
    for i in range(2):
        n = int(batch["attention_mask"][i].sum())
        ids, mask = batch["input_ids"][i, :n].tolist(), batch["loss_mask"][i, :n].bool()
        trained = tok.decode([t for t, m in zip(ids, mask) if m])
        assert trained == CALL_TEXT + END + "The answer is 7." + END  # both calls, nothing else
        untrained = tok.decode([t for t, m in zip(ids, mask) if not m])
        assert "<|im_start|>tool\n7<|im_end|>" in untrained  # the tool result is context, not loss
        assert batch["logprobs"][i, :n][mask].lt(0).all() and batch["logprobs"][i, :n][~mask].eq(0).all()
        assert batch["versions"][i, :n][mask].ge(0).all() and batch["versions"][i, :n][~mask].eq(-1).all()
    stats = sample_stats(batch)
    assert stats == {
        "rollout/agent/calls": 2.0,
        "rollout/agent/tool_calls": 1.0,
        "rollout/agent/tool_call_rate": 1.0,
        "rollout/agent/malformed_tool_calls": 0.0,
        "rollout/agent/untrained_calls": 0.0,
        "rollout/agent/accuracy": 1.0,
    }


def test_call_rows_go_call_by_call_across_the_group(engine, scripted_chat_model_dir):
    wf = workflow(scripted_chat_model_dir, "calculator", samples="call", max_calls=3)
    try:
        batch = engine.rollout_batch([RECORD], wf)
    finally:
        wf.close()
    tok = wf.tokenizer
    assert batch["input_ids"].shape[0] == 6  # 3 rows per run, 2 runs: row j * 2 + i is call j of run i
    outputs = [tok.decode(batch["input_ids"][r][batch["loss_mask"][r].bool()].tolist()) for r in range(6)]
    assert outputs == [CALL_TEXT + END] * 2 + ["The answer is 7." + END] * 2 + ["", ""]
    assert batch["attention_mask"][4:].sum(1).tolist() == [1, 1]  # padding rows: one token, no loss
    assert batch["rewards"].tolist() == [1.25] * 6  # every row has its run's reward
    assert sample_stats(batch)["rollout/agent/calls"] == 2.0


def test_malformed_tool_call_never_crashes_the_episode(engine, scripted_chat_model_dir):
    wf = workflow(scripted_chat_model_dir, "malformed")
    try:
        batch = engine.rollout_batch([RECORD], wf)
    finally:
        wf.close()
    assert batch["rewards"].tolist() == [0.0, 0.0]
    stats = sample_stats(batch)
    assert stats["rollout/agent/malformed_tool_calls"] == 1.0 and stats["rollout/agent/tool_call_rate"] == 0.0


def test_an_agent_without_calls_gives_an_untrainable_row(engine, scripted_chat_model_dir):
    wf = workflow(scripted_chat_model_dir, "no_calls")
    batch = engine.rollout_batch([RECORD], wf)
    wf.close()
    assert batch["rewards"].tolist() == [0.5, 0.5] and batch["loss_mask"].sum() == 0


@pytest.mark.parametrize(
    "run, error, workers",
    [("returns_text", "finite numbers", 0), ("fails", "the agent broke", 0), ("fails", "the agent broke", 1)],
)
def test_misbehaving_agents_fail_the_episode_with_a_message(engine, scripted_chat_model_dir, run, error, workers):
    wf = workflow(scripted_chat_model_dir, run, workers=workers)
    with pytest.raises(RolloutError, match=error):
        engine.rollout_batch([RECORD], wf)
    wf.close()


def test_config_builds_the_agent_workflow(scripted_chat_model_dir, tmp_path):
    from launcher.compose import compose

    cfg = validate_config(
        compose("calculator_agent_cpu", [f"actor.path={scripted_chat_model_dir}", "workflow.agent.samples=call"])
    )
    wf = build_workflow(cfg, scripted_chat_model_dir)
    assert isinstance(wf, AgentWorkflow) and wf.samples == "call" and wf.max_calls == 3
    assert wf.run.__module__ == "examples.calculator_agent"
    with pytest.raises(TypeError, match="not an async function"):
        workflow(scripted_chat_model_dir, "not_async")
    with pytest.raises(ValueError, match="samples"):
        workflow(scripted_chat_model_dir, "no_calls", samples="turns")


def test_runs_are_dealt_over_clients_of_at_most_64_connections():
    import asyncio

    from areal.workflow.agent import POOL_SHARD, openai_clients

    async def shards():
        clients = openai_clients("http://127.0.0.1:9/v1", 10.0, 2 * POOL_SHARD + 2)
        for client in clients:
            await client.close()
        return len(clients)

    assert asyncio.run(shards()) == 3 and POOL_SHARD == 64
