"""512 agent runs at once (64 episodes x 8 samples) through the proxy of a worker process and a real
built-in server: every run completes with its own reward, and the kernel's listen queues never
overflow (TcpExt ListenOverflows). Before the proxy listened with a backlog sized to the runs, a
burst like this overflowed its queue of 128, and the kernel reset connections it never saw."""

import pytest

from areal.config.rollout import GenerationConfig
from areal.engine.sglang.client import RemoteSGLangEngine
from areal.infra.sockets import listen_overflows
from areal.workflow.agent import AgentWorkflow
from tests.serving import start_server

pytestmark = [pytest.mark.slow, pytest.mark.second_lane]

EPISODES, SAMPLES = 64, 8


def test_512_concurrent_agent_runs_complete_without_listen_overflows(scripted_chat_model_dir):
    server = start_server(
        scripted_chat_model_dir,
        extra_args=["--dtype", "float32", "--max-running-requests", "128"],
        env={"OMP_NUM_THREADS": "1"},
    )
    engine = RemoteSGLangEngine.from_pretrained(
        scripted_chat_model_dir,
        server_addrs=[server.url],
        rollout={"consumer_batch_size": EPISODES, "max_concurrent_rollouts": EPISODES},
    )
    wf = AgentWorkflow(
        "tests.workflow.agents:one_token",
        GenerationConfig(n_samples=SAMPLES, max_new_tokens=1, temperature=0.0),
        scripted_chat_model_dir,
        concurrency=EPISODES * SAMPLES,
        workers=1,
    )
    records = [{"i": i} for i in range(EPISODES)]
    try:
        engine.rollout_batch(records[:1], wf)  # the worker starts; its connections are not the burst
        before = listen_overflows()
        batch = engine.rollout_batch(records, wf)
        after = listen_overflows()
    finally:
        wf.close()
        engine.destroy()
        server.stop()
    assert batch["rewards"].tolist() == [float(i) for i in range(EPISODES) for _ in range(SAMPLES)]
    assert before is not None and after == before, f"ListenOverflows rose by {after - before}"
