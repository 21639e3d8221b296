"""RewardRunner: rewards in spawned workers; a hanging reward scores 0 and never stalls anything."""

import asyncio
import itertools
import logging
import os
import time

import psutil
import pytest

from areal.reward import RewardRunner, run_reward_with_timeout
from tests.reward.slow_rewards import length_reward

HANG = "tests.reward.slow_rewards:maybe_hang"
HANG_GUARD_S = 120  # bounds below only stop a hang; none is what a test checks


async def until(condition) -> None:
    """Yield to the loop until condition() holds (callers bound the whole run with a hang guard)."""
    while not condition():
        await asyncio.sleep(0.01)


def wait_gone(pid: int, timeout_s: float = 5.0) -> bool:
    """True once `pid` no longer runs (zombies count as gone only after reaping)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid):
            return True
        time.sleep(0.05)
    return False


def test_values_and_sample_fields_reach_the_reward():
    async def main():
        with RewardRunner("tests.reward.slow_rewards:length_reward", timeout_s=10) as runner:
            return await asyncio.gather(*(runner("p", "x" * i, [1], [2, 3], bonus=0.5) for i in range(6)))

    assert asyncio.run(main()) == [i + 0.5 for i in range(6)]


def test_builtin_reward_by_name():
    async def main():
        with RewardRunner("arith_shaped", timeout_s=10, max_workers=1) as runner:
            return [await runner("3+4=", c, [], [], solution="7") for c in ("7", "9", "x")]

    assert asyncio.run(main()) == [1.0, 0.4, 0.0]


def test_hanging_reward_times_out_without_stalling_loop_or_pool(tmp_path, caplog):
    pid_file = tmp_path / "hung.pid"

    async def main():
        # 2 s: far longer than the other calls take, which must finish while the reward hangs
        runner = RewardRunner(HANG, timeout_s=2.0, max_workers=2)
        finished = []

        async def call(completion, **kwargs):
            value = await runner("p", completion, [], [], **kwargs)
            finished.append(completion)
            return value

        try:
            await runner("p", "warm", [], [])  # workers started: later timings are the reward's own
            hung = asyncio.create_task(call("hang", pid_file=str(pid_file)))
            others = [asyncio.create_task(call("ok" * i)) for i in range(1, 5)]
            # the loop runs while the reward hangs: it sees the hung worker start before the timeout
            await until(lambda: pid_file.exists() or hung.done())
            loop_ran = pid_file.exists() and not hung.done()
            results = await asyncio.gather(hung, *others)
            after = await runner("p", "after", [], [])  # the replaced pool still serves
            return results, finished, loop_ran, after, runner.n_timeouts
        finally:
            runner.close()

    with caplog.at_level(logging.WARNING, logger="areal.reward.runner"):
        results, finished, loop_ran, after, n_timeouts = asyncio.run(asyncio.wait_for(main(), HANG_GUARD_S))
    assert results == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert after == 5.0 and n_timeouts == 1
    assert loop_ran
    assert finished[-1] == "hang"  # the other worker served the rest meanwhile: the pool was not held
    assert any("ran past 2.0s" in r.getMessage() and HANG in r.getMessage() for r in caplog.records)
    assert wait_gone(int(pid_file.read_text())), "the hung worker must be killed"


def test_a_group_scores_as_its_calls_would_in_one_worker_task():
    async def main():
        with RewardRunner("tests.reward.slow_rewards:length_reward", timeout_s=10) as runner:
            values = await runner.score_many([(("p", "x" * i, [1], [2, 3]), {"bonus": 0.5}) for i in range(6)])
            empty = await runner.score_many([])
        with RewardRunner(HANG, timeout_s=10, max_workers=2) as runner:
            pids = await runner.score_many([(("p", "pid", [], []), {})] * 6)
        return values, empty, pids

    values, empty, pids = asyncio.run(main())
    assert values == [i + 0.5 for i in range(6)] and empty == []
    assert len(set(pids)) == 1  # one task: one worker scored the whole group


def test_a_hang_in_a_group_scores_only_that_sample_zero(tmp_path, caplog):
    """The group runs past timeout_s for each of its calls: its worker is killed and every sample
    scored alone, where only the hanging one times out."""
    pid_file = tmp_path / "hung.pid"

    async def main():
        with RewardRunner(HANG, timeout_s=2.0, max_workers=1) as runner:
            await runner("p", "warm", [], [])  # the worker started: the timeouts below are the reward's own
            calls = [
                (("p", "ok", [], []), {}),
                (("p", "hang", [], []), {"pid_file": str(pid_file)}),
                (("p", "abc", [], []), {}),
            ]
            values = await runner.score_many(calls)
            return values, runner.n_timeouts, await runner("p", "after", [], [])

    with caplog.at_level(logging.WARNING, logger="areal.reward.runner"):
        values, n_timeouts, after = asyncio.run(asyncio.wait_for(main(), HANG_GUARD_S))
    assert values == [2.0, 0.0, 3.0] and n_timeouts == 1 and after == 5.0
    assert "a group of 3 samples ran past 2.0s each" in caplog.text
    assert wait_gone(int(pid_file.read_text()))  # the hung workers were killed, not left running


def test_an_exception_in_a_group_propagates():
    async def main():
        with RewardRunner("tests.reward.slow_rewards:raises", timeout_s=10, max_workers=1) as runner:
            return await runner.score_many([(("p", "c", [], []), {})] * 2)

    with pytest.raises(ValueError, match="bad completion 'c'"):
        asyncio.run(main())


def test_calls_running_when_the_pool_is_replaced_are_retried(tmp_path):
    """A call busy on the other worker when a hung one is killed is rerun, not lost or zeroed."""

    async def attempt(folder):
        hung_pid, starts = folder / "hung.pid", folder / "starts"
        with RewardRunner(HANG, timeout_s=HANG_GUARD_S, max_workers=2) as runner:
            pids = set()
            while len(pids) < 2:  # both workers up: a call's timeout now starts with the call
                pids |= set(await asyncio.gather(*(runner("p", "pid", [], []) for _ in range(2))))
            runner.timeout_s = 2.0  # the hung call's
            hung = asyncio.create_task(runner("p", "hang", [], [], pid_file=str(hung_pid)))
            await until(hung_pid.exists)
            runner.timeout_s = HANG_GUARD_S  # the busy call's own timeout: it must not race the kill
            busy = asyncio.create_task(runner("p", "busy", [], [], starts=str(starts)))
            await until(starts.exists)
            if runner.n_timeouts:  # it started only after the kill (a slow start): void
                busy.cancel()
                return None
            return await hung, await busy, runner.n_timeouts, starts.read_text().split()

    async def main():
        for i in itertools.count():
            folder = tmp_path / str(i)
            folder.mkdir()
            if (got := await attempt(folder)) is not None:
                return got

    hung, value, n_timeouts, starts = asyncio.run(asyncio.wait_for(main(), HANG_GUARD_S))
    assert (hung, value, n_timeouts) == (0.0, 4.0, 1)
    assert len(starts) == 2 and starts[0] != starts[1]  # killed with the pool, then run again


def test_reward_exceptions_propagate():
    async def main(spec):
        with RewardRunner(spec, timeout_s=10, max_workers=1) as runner:
            return await runner("p", "c", [], [])

    with pytest.raises(ValueError, match="bad completion 'c'"):
        asyncio.run(main("tests.reward.slow_rewards:raises"))
    with pytest.raises(TypeError, match="not_a_number returned 'high'"):
        asyncio.run(main("tests.reward.slow_rewards:not_a_number"))


def test_a_worker_killed_from_outside_is_replaced_and_the_sample_scored_again(tmp_path):
    """A worker that dies once (the OOM killer, an operator's kill) costs a pool restart, not the
    run; one that dies again on the same sample is an error naming the reward."""
    spec = "tests.reward.slow_rewards:dies"
    marker = tmp_path / "died"

    async def main(completion):
        with RewardRunner(spec, timeout_s=HANG_GUARD_S, max_workers=1) as runner:
            return await runner("p", completion, [], [], marker=str(marker))

    assert asyncio.run(main("die_once")) == len("die_once")
    assert wait_gone(int(marker.read_text()))
    with pytest.raises(RuntimeError, match="reward 'tests.reward.slow_rewards:dies': its worker process died twice"):
        asyncio.run(main("die"))


def test_a_worker_killed_between_calls_is_replaced():
    """The pool is already broken when the next call comes (chaos.py: a reward worker SIGKILLed
    while the trainer trained): the call gets a fresh pool."""

    async def main():
        with RewardRunner(HANG, timeout_s=HANG_GUARD_S, max_workers=1) as runner:
            pid = int(await runner("p", "pid", [], []))
            os.kill(pid, 9)
            assert wait_gone(pid)
            # until the pool knows (ProcessPoolExecutor's own flag), so the next submit is refused
            await asyncio.wait_for(until(lambda: runner._pool._broken), HANG_GUARD_S)
            return await runner("p", "abc", [], [])

    assert asyncio.run(main()) == 3.0


def test_bad_spec_and_arguments_fail_in_the_caller():
    with pytest.raises(ImportError, match="no_such_module"):
        RewardRunner("no_such_module:fn", timeout_s=1)
    with pytest.raises(ValueError, match="timeout must be > 0"):
        RewardRunner("gsm8k", timeout_s=0)


def test_run_reward_with_timeout(tmp_path):
    assert run_reward_with_timeout(length_reward, 10, "p", "abc", [], []) == 3.0
    pid_file = tmp_path / "hung.pid"
    # 0.0 is the timeout's answer (the reward itself never returns); the kill shows below
    assert run_reward_with_timeout(HANG, 0.5, "p", "hang", [], [], pid_file=str(pid_file)) == 0.0
    assert wait_gone(int(pid_file.read_text()))
    assert os.getpid() != int(pid_file.read_text())


def test_workers_exit_when_their_parent_is_sigkilled(tmp_path):
    """A process holding a RewardRunner is SIGKILLed (no teardown): its spawned workers exit too
    instead of waiting on their call queue for ever as orphans."""
    import signal
    import subprocess
    import sys

    script = (
        "import asyncio, os\n"
        "from areal.reward import RewardRunner\n"
        "r = RewardRunner('tests.reward.slow_rewards:length_reward', timeout_s=30, max_workers=2)\n"
        "asyncio.run(r('p', 'abc', [], [1]))\n"
        "print(' '.join(str(p) for p in r._pool._processes), flush=True)\n"
        "import time; time.sleep(600)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=os.getcwd(), env=os.environ.copy()
    )
    try:
        line = parent.stdout.readline()  # the first reward ran: every worker has started
        workers = [psutil.Process(int(p)) for p in line.split()]
        assert len(workers) == 2, line
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
    gone, alive = psutil.wait_procs(workers, timeout=30)
    left = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    for p in left:
        p.kill()
    assert not left, f"reward workers outlived their SIGKILLed parent: {[p.pid for p in left]}"
