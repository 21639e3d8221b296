"""RewardRunner: rewards in spawned workers; a hanging reward scores 0 and never stalls anything."""

import asyncio
import logging
import os
import time

import psutil
import pytest

from areal.reward import RewardRunner, run_reward_with_timeout
from tests.reward.slow_rewards import length_reward

HANG = "tests.reward.slow_rewards:maybe_hang"


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
        ticks = 0

        async def ticker():  # proves the event loop keeps running while a reward hangs
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        runner = RewardRunner(HANG, timeout_s=1.0, max_workers=2)
        try:
            await runner("p", "warm", [], [])  # workers started: later timings are the reward's own
            tick_task = asyncio.create_task(ticker())
            start = time.monotonic()
            results = await asyncio.gather(
                runner("p", "hang", [], [], pid_file=str(pid_file)),
                *(runner("p", "ok" * i, [], []) for i in range(1, 5)),
            )
            elapsed = time.monotonic() - start
            tick_task.cancel()
            after = await runner("p", "after", [], [])  # the replaced pool still serves
            return results, elapsed, ticks, after, runner.n_timeouts
        finally:
            runner.close()

    with caplog.at_level(logging.WARNING, logger="areal.reward.runner"):
        results, elapsed, ticks, after, n_timeouts = asyncio.run(main())
    assert results == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert after == 5.0 and n_timeouts == 1
    assert elapsed < 8.0  # one timeout (1 s) plus restarts, not forever
    assert ticks >= 10
    assert any("ran past 1.0s" in r.getMessage() and HANG in r.getMessage() for r in caplog.records)
    assert wait_gone(int(pid_file.read_text())), "the hung worker must be killed"


def test_calls_running_when_the_pool_is_replaced_are_retried():
    """A call busy on the other worker when a hung one is killed is rerun, not lost or zeroed."""
    async def main():
        with RewardRunner(HANG, timeout_s=2.0, max_workers=2) as runner:
            await runner("p", "warm", [], [])

            async def late_call():  # runs 1.0-2.5 s, across the kill at 2.0 s
                await asyncio.sleep(1.0)
                start = time.monotonic()
                value = await runner("p", "sleep:1.5", [], [])
                return value, time.monotonic() - start

            hung, (value, duration) = await asyncio.gather(runner("p", "hang", [], []), late_call())
            return hung, value, duration, runner.n_timeouts

    hung, value, duration, n_timeouts = asyncio.run(main())
    assert (hung, value, n_timeouts) == (0.0, 9.0, 1)
    assert duration > 2.2  # 1.0 s lost to the kill, then the full 1.5 s again


def test_reward_exceptions_propagate():
    async def main(spec):
        with RewardRunner(spec, timeout_s=10, max_workers=1) as runner:
            return await runner("p", "c", [], [])

    with pytest.raises(ValueError, match="bad completion 'c'"):
        asyncio.run(main("tests.reward.slow_rewards:raises"))
    with pytest.raises(TypeError, match="not_a_number returned 'high'"):
        asyncio.run(main("tests.reward.slow_rewards:not_a_number"))


def test_bad_spec_and_arguments_fail_in_the_caller():
    with pytest.raises(ImportError, match="no_such_module"):
        RewardRunner("no_such_module:fn", timeout_s=1)
    with pytest.raises(ValueError, match="timeout must be > 0"):
        RewardRunner("gsm8k", timeout_s=0)


def test_run_reward_with_timeout(tmp_path):
    assert run_reward_with_timeout(length_reward, 10, "p", "abc", [], []) == 3.0
    pid_file = tmp_path / "hung.pid"
    start = time.monotonic()
    assert run_reward_with_timeout(HANG, 0.5, "p", "hang", [], [], pid_file=str(pid_file)) == 0.0
    assert time.monotonic() - start < 10
    assert wait_gone(int(pid_file.read_text()))
    assert os.getpid() != int(pid_file.read_text())
