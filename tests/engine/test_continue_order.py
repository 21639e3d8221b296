"""At continue, the answers an abort-mode pause cut short are resubmitted before the rollout
executor starts the episodes that the new version admits (areal/engine/sglang/gate.py): the
servers queue first come, first served, and the trainer needs the older episodes first. Against
a real built-in server, with the real executor and control."""

import asyncio

import torch

from areal.api.inference import ModelRequest
from areal.api.workflow import RolloutWorkflow
from areal.engine.sglang import client as client_module
from areal.engine.sglang.client import RemoteSGLangEngine
from areal.engine.sglang.gate import ContinueSignal
from areal.models.tiny import make_tiny_model_dir
from tests.serving import server_load, wait_for

LONG = 3000  # new tokens: still generating when the test pauses


class OneAnswer(RolloutWorkflow):
    async def arun_episode(self, engine, data):
        req = ModelRequest(input_ids=[1, 5, 6], max_new_tokens=data["tokens"], ignore_eos=True)
        answer = await engine.agenerate(req)
        return {"input_ids": torch.tensor([answer.output_tokens]), "rewards": torch.tensor([1.0])}


def test_aborted_answers_are_resubmitted_before_new_episodes_start(tmp_path, monkeypatch):
    """Three long episodes, two generating and one queued on the server (max_running_requests 2);
    two short ones wait for version 1. An abort-mode pause cuts the three short, and at continue
    their remainders are posted before the two new episodes' requests. The queued one came back
    with no token: it waits at the gate too, with no backoff (one of 600 s here would show)."""
    monkeypatch.setattr(client_module, "_ABORT_BACKOFF_S", (600.0,))
    model = make_tiny_model_dir(tmp_path / "long", max_position=LONG + 64)
    engine = RemoteSGLangEngine.from_pretrained(
        str(model),
        cluster={"fileroot": str(tmp_path / "run")},
        launcher={"server_env": {"OMP_NUM_THREADS": "1"}},
        # version 0 admits one batch of 3; the next 2 wait for version 1
        rollout={"consumer_batch_size": 3, "max_concurrent_rollouts": 8, "max_head_offpolicyness": 0},
        sglang={"dtype": "float32", "max_running_requests": 2},
    )
    posted = []  # the rid of every /generate the client sends, in order
    send = engine._apost

    async def recorded(addr, route, body, stream=False):
        posted.append(body["rid"])
        return await send(addr, route, body, stream=stream)

    monkeypatch.setattr(engine, "_apost", recorded)
    url = f"http://{engine.addrs[0]}"
    try:
        for tokens in (LONG, LONG, LONG, 4, 4):
            engine.submit({"tokens": tokens}, OneAnswer())
        wait_for(
            lambda: (lambda load: load["running"] == 2 and load["waiting"] == 1)(server_load(url)),
            "two answers generating, one queued",
        )
        report = engine.control.pause("abort")
        assert report["requests_drained"] == 3
        wait_for(lambda: engine.control._continued.waiting == 3, "the three cut answers waiting for continue")
        assert len(posted) == 3  # the two new episodes wait for version 1
        engine.control.set_version(1)
        engine.control.resume()
        wait_for(lambda: len(posted) == 8, lambda: f"the resubmissions and the new episodes' requests: {posted}")
        assert [rid.endswith("-r1") for rid in posted[3:]] == [True, True, True, False, False], posted
        assert engine.wait(5, timeout=120)["input_ids"].shape[0] == 5
    finally:
        if engine.control.paused:
            engine.control.resume()
        engine.destroy()


def test_continue_signal_wakes_its_waiters_in_the_order_they_came_and_has_a_backstop():
    paused = [True]

    async def main():
        signal, woke = ContinueSignal(backstop_s=60.0), []

        async def waiter(name):
            await signal.wait(lambda: paused[0])
            woke.append(name)

        tasks = [asyncio.create_task(waiter(n)) for n in "abc"]
        while signal.waiting < 3:
            await asyncio.sleep(0)
        signal.notify()  # still paused: each reads the gate again and waits on
        for _ in range(5):
            await asyncio.sleep(0)
        assert woke == [] and signal.waiting == 3
        paused[0] = False
        signal.notify()
        await asyncio.gather(*tasks)
        assert woke == ["a", "b", "c"] and signal.waiting == 0

        paused[0] = True  # no notify at all: the backstop reads the gate again
        backstop = ContinueSignal(backstop_s=0.01)
        task = asyncio.create_task(backstop.wait(lambda: paused[0]))
        while backstop.waiting < 1:
            await asyncio.sleep(0)
        paused[0] = False
        await asyncio.wait_for(task, 60)

    asyncio.run(main())


def test_continue_signal_returns_at_once_when_not_paused():
    async def main():
        signal = ContinueSignal(backstop_s=60.0)
        await asyncio.wait_for(signal.wait(lambda: False), 60)
        assert signal.waiting == 0

    asyncio.run(main())
