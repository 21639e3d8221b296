"""Agent episodes in worker processes (areal/rollout/episode_workers.py), against a real built-in
server: the gate follows the trainer's control, a killed worker is named in the error of the
episodes it ran, close() stops the workers cleanly, and an agent that cannot travel is refused
when the workflow is built, with the key that keeps it in-process."""

import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from areal.api.weights import WeightUpdateMeta
from areal.config.rollout import GenerationConfig
from areal.rollout.episode_workers import _Worker, dumps
from areal.rollout.executor import RolloutError
from areal.workflow.agent import AgentWorkflow
from tests.serving import wait_for

A = "tests.workflow.agents:"
RECORD = {"question": "add 3 and 4", "bonus": 0.25, "i": 0}


@pytest.fixture(scope="module")
def engine(scripted_chat_engine):
    return scripted_chat_engine


def workflow(model_dir, run, **kw):
    return AgentWorkflow(
        A + run, GenerationConfig(n_samples=2, max_new_tokens=128, temperature=0.0), model_dir, workers=1, **kw
    )


def episode_in_a_worker(engine, model_dir) -> tuple[AgentWorkflow, int]:
    """A workflow whose one episode never ends, submitted and running in its worker; the pid."""
    wf = workflow(model_dir, "waits")
    engine.submit(RECORD, wf)
    wait_for(lambda: wf.pool is not None and wf.pool.running() == 1, "the episode to reach its worker", 60)
    return wf, wf.pool.pids[0]


def test_workers_follow_the_gate_and_stop_cleanly(engine, scripted_chat_model_dir):
    wf = workflow(scripted_chat_model_dir, "one_tool_call")
    batch = engine.rollout_batch([RECORD], wf)
    assert batch["rewards"].tolist() == [0.5, 0.5]  # the tool call parsed in the worker
    pool = wf.pool
    assert pool.pause() == 1  # the worker confirmed its gate closed
    pool.resume()
    with engine.control.weight_update(WeightUpdateMeta("disk")):  # the control's own pause reaches the worker too
        pass
    assert engine.rollout_batch([RECORD], wf)["rewards"].tolist() == [0.5, 0.5]
    wf.close()
    assert pool.exit_codes() == [0]  # it stopped by itself (closed its proxy and client), not killed
    assert pool not in engine.control._listeners


def test_a_killed_worker_is_named_in_the_error(engine, scripted_chat_model_dir):
    wf, pid = episode_in_a_worker(engine, scripted_chat_model_dir)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(RolloutError, match=rf"agent-worker-0 \(pid {pid}\) was killed by SIGKILL while running"):
        engine.wait(1, timeout=60)
    wf.close()


def test_an_agent_that_cannot_travel_is_refused_with_the_key(scripted_chat_model_dir):
    async def local_agent(client, data):
        return 1.0

    with pytest.raises(
        ValueError, match=r"make the agent .*local_agent.* a module-level async function .*workflow.agent.workers=0"
    ):
        AgentWorkflow(local_agent, GenerationConfig(n_samples=1), scripted_chat_model_dir, workers=1)


def test_a_stopped_worker_is_killed_and_named(engine, scripted_chat_model_dir):
    engine.config.launcher.stopped_timeout_s = 1.0  # read when the workers start
    try:
        wf, pid = episode_in_a_worker(engine, scripted_chat_model_dir)
        os.kill(pid, signal.SIGSTOP)
        with pytest.raises(RolloutError, match=r"was stopped \(SIGSTOP\) for 1 s \(launcher.stopped_timeout_s\)"):
            engine.wait(1, timeout=60)
    finally:
        engine.config.launcher.stopped_timeout_s = 60.0
    wf.close()


def test_a_worker_waited_for_by_two_threads_gives_both_its_exit_code(monkeypatch):
    """close() and the reader thread wait for an exiting worker at once. The thread that reaps it
    (waitpid) is held between reaping and storing the status, as a starved thread is under load,
    until the other has asked: that one must get the exit code too, not a live-looking process."""
    process = multiprocessing.get_context("spawn").Process(target=os._exit, args=(3,))
    process.start()
    w = _Worker("w", process, conn=None)
    reaped, other_asked = threading.Event(), threading.Event()

    class ReapLock:  # the worker's reap lock, saying when the other thread asks for its turn
        def __init__(self):
            self.lock = threading.Lock()

        def acquire(self, timeout=-1):
            if threading.current_thread().name == "other":
                other_asked.set()
            return self.lock.acquire(timeout=timeout)

        def release(self):
            self.lock.release()

    w.reap_lock = ReapLock()
    real_waitpid = os.waitpid

    def waitpid(pid, flags):
        result = real_waitpid(pid, flags)
        if pid == process.pid and result[0] == pid:
            reaped.set()
            assert other_asked.wait(60)
        return result

    monkeypatch.setattr(os, "waitpid", waitpid)
    codes = {}

    def wait(name):
        codes[name] = w.wait_exit(60)
        other_asked.set()  # the other thread is done (a lock-free wait never asks for a turn)

    reaper = threading.Thread(target=wait, args=("reaper",), name="reaper")
    reaper.start()
    assert reaped.wait(60)
    other = threading.Thread(target=wait, args=("other",), name="other")
    other.start()
    other.join(60)
    reaper.join(60)
    assert codes == {"reaper": 3, "other": 3}


_LEAKER = """
import multiprocessing, os, signal, sys
from areal.rollout.episode_workers import start_resource_tracker_quietly

def hold_a_semaphore(ready):
    lock = multiprocessing.get_context("spawn").Lock()  # named, registered with the shared tracker
    ready.set()
    signal.pause()

if __name__ == "__main__":
    if sys.argv[1] == "quiet":
        start_resource_tracker_quietly()
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    child = ctx.Process(target=hold_a_semaphore, args=(ready,))
    child.start()
    assert ready.wait(60), "the child did not create its semaphore within 60 s"
    os.kill(child.pid, signal.SIGKILL)
    child.join(60)
"""


@pytest.mark.parametrize("quiet", [True, False])
def test_a_killed_workers_semaphores_are_cleaned_up_without_a_warning(tmp_path, quiet):
    """A worker killed by a signal leaves its named semaphores to the resource tracker, which
    unlinks them at the parent's exit; with the tracker started by start_resource_tracker_quietly
    (as EpisodeWorkers.start does), it does not warn about them."""
    script = tmp_path / "leaker.py"
    script.write_text(_LEAKER)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env.pop("PYTHONWARNINGS", None)
    out = subprocess.run(
        [sys.executable, str(script), "quiet" if quiet else "loud"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert ("leaked semaphore" in out.stderr) is (not quiet), out.stderr


@pytest.mark.parametrize(
    "tensor",
    [
        torch.randn(3, 4).to(torch.bfloat16),
        torch.tensor([True, False, True]),
        torch.arange(12).reshape(3, 4).t(),  # not contiguous
        torch.zeros(0, 5, dtype=torch.int64),
        torch.tensor(2.5),
    ],
    ids=["bfloat16", "bool", "transposed", "empty", "scalar"],
)
def test_a_messages_cpu_tensors_travel_as_their_bytes(tensor):
    """An episode's rows reach the trainer with their dtypes, shapes and values, through the raw-bytes
    reduction (not torch.save's, which loads each storage through a torch.load of its own)."""
    data = dumps(("done", 1, {"x": tensor, "n": 3}))
    assert b"_tensor_from_bytes" in data
    back = pickle.loads(data)[2]
    assert back["n"] == 3
    assert back["x"].dtype == tensor.dtype and back["x"].shape == tensor.shape
    assert torch.equal(back["x"], tensor)


def test_tensors_with_autograd_history_or_sparse_keep_torchs_own_reduction():
    leaf = torch.randn(2, 2, requires_grad=True)
    back = pickle.loads(dumps({"x": leaf}))["x"]
    assert back.requires_grad and torch.equal(back.detach(), leaf.detach())
    sparse = torch.eye(3).to_sparse()
    back = pickle.loads(dumps(sparse))
    assert back.is_sparse and torch.equal(back.to_dense(), torch.eye(3))
