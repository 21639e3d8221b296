"""Running reward functions in worker processes, with a timeout that cannot stall the caller.

Rewards are user code: a regex can backtrack for minutes, a sympy call can hang, a verifier can
leak memory. The rollout executor awaits `RewardRunner(...)(...)`; the call runs in a process
pool, so CPU-heavy rewards never block the event loop, and a call that runs past `timeout_s`
scores 0.0 with a warning while its worker is killed and the pool replaced, so a hung reward
holds neither the event loop nor a pool slot.

Functions travel to workers as specs (`gsm8k` or `package.module:function`, see
`areal.reward.registry`), not as objects: workers are spawned (safe next to CUDA and threads),
and a spec is always picklable where a closure is not.

Workers end with the process that started them, even when it is SIGKILLed (a trainer rank, or
the launcher above it, killed without a teardown): each watches its parent's sentinel from a
daemon thread and exits when it closes, so no worker is left orphaned (areal/utils/lifetime.py).

Exceptions raised by the reward propagate to the caller (a crashing reward is a bug to see,
not a zero to average away); only timeouts become 0.0. A worker that dies (killed from outside,
out of memory) breaks the pool: the pool is replaced and the sample scored again once; a second
death while scoring it is an error naming the reward.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import multiprocessing
import os
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable

from areal.infra.sockets import OpenFileLimitError, is_out_of_files, out_of_files_text
from areal.reward.registry import resolve_reward_fn
from areal.utils.lifetime import exit_with_parent

logger = logging.getLogger(__name__)

# Spawning a worker re-imports the parent's main module (which may import torch); that time is
# not the reward's: calls wait up to this long for the workers to start before their timeout runs.
DEFAULT_STARTUP_TIMEOUT_S = 60.0


@functools.lru_cache(maxsize=None)
def _resolve_cached(spec: str) -> Callable[..., Any]:
    """Resolve each spec once per worker process."""
    return resolve_reward_fn(spec)


def _target_fn(target: str | Callable[..., Any]) -> Callable[..., Any]:
    return _resolve_cached(target) if isinstance(target, str) else target


def _warm(target: str | Callable[..., Any]) -> int:
    """Run in a fresh worker: import the reward's module ahead of the first timed call."""
    _target_fn(target)
    return os.getpid()


def _call_in_worker(target: str | Callable[..., Any], args: tuple, kwargs: dict) -> float:
    """The reward's value as a float; a non-numeric return is an error naming the reward."""
    value = _target_fn(target)(*args, **kwargs)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"reward {_name(target)} returned {value!r}; rewards must return a number") from None


def _call_many_in_worker(target: str | Callable[..., Any], calls: list[tuple[tuple, dict]]) -> list[float]:
    """Several samples' rewards in one worker task (RewardRunner.score_many)."""
    return [_call_in_worker(target, args, kwargs) for args, kwargs in calls]


def _name(target: str | Callable[..., Any]) -> str:
    return target if isinstance(target, str) else getattr(target, "__qualname__", repr(target))


def _new_pool(max_workers: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(max_workers, mp_context=multiprocessing.get_context("spawn"), initializer=_start_worker)


def _start_worker() -> None:
    """A reward worker's first act: end with its parent, and say what it is in `ps`."""
    from areal.utils.proc_name import set_process_name

    exit_with_parent()
    set_process_name("areal-reward")


def _kill_pool(pool: ProcessPoolExecutor) -> None:
    """Stop a pool now, hung workers included (shutdown alone would wait for them forever).

    ProcessPoolExecutor has no public kill before Python 3.14, so this reads its worker table.
    """
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in processes:
        proc.kill()
    for proc in processes:
        proc.join(timeout=5)


class RewardRunner:
    """Async reward calls in a spawned process pool, each bounded by `timeout_s`.

    At most `max_workers` calls run at once; the others wait for a slot, so the timeout measures
    the reward's own run time, not time spent queueing.
    """

    def __init__(
        self, spec: str, timeout_s: float, max_workers: int = 2, startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S
    ):
        if timeout_s <= 0:
            raise ValueError(f"reward timeout must be > 0 seconds, got {timeout_s}")
        if max_workers < 1:
            raise ValueError(f"reward max_workers must be >= 1, got {max_workers}")
        resolve_reward_fn(spec)  # a misspelt spec fails here, in the caller, not in a worker
        self.spec = spec
        self.timeout_s = float(timeout_s)
        self.max_workers = max_workers
        self.startup_timeout_s = float(startup_timeout_s)
        self.n_timeouts = 0
        self._generation = 0
        self._pool: ProcessPoolExecutor | None = None
        self._warmups: list[Future] = []
        self._slots: asyncio.Semaphore | None = None
        self._slots_loop: asyncio.AbstractEventLoop | None = None

    async def __call__(self, *args, **kwargs) -> float:
        """The reward of one sample, or 0.0 (and a warning) if it ran past the timeout."""
        crashed = False
        async with self._loop_slots():
            for _ in range(3):
                pool, generation = self._current_pool()
                try:
                    future = asyncio.wrap_future(pool.submit(_call_in_worker, self.spec, args, kwargs))
                except BrokenProcessPool:  # a worker died before this call: not its fault
                    self._replace_pool(generation)
                    logger.warning(
                        "reward %r: a worker process had died (killed, or out of memory); pool restarted", self.spec
                    )
                    continue
                try:
                    await self._until_workers_started(future)
                    return await asyncio.wait_for(future, self.timeout_s)
                except asyncio.TimeoutError:
                    self._on_timeout(generation)
                    return 0.0
                except BrokenProcessPool:
                    if generation == self._generation:  # a worker died on its own: not a timeout
                        self._replace_pool(generation)
                        if crashed:
                            raise RuntimeError(
                                f"reward {self.spec!r}: its worker process died twice while scoring this sample "
                                "(a crash or out of memory in the reward itself?)"
                            ) from None
                        crashed = True  # killed from outside (OOM killer, an operator) it may be no fault of ours
                        logger.warning(
                            "reward %r: a worker process died (killed, or out of memory); pool restarted, "
                            "scoring the sample again",
                            self.spec,
                        )
                    # else our own pool replacement (another call timed out or crashed) broke this call
            raise RuntimeError(f"reward {self.spec!r}: the worker pool kept being replaced; giving up")

    async def score_many(self, calls: list[tuple[tuple, dict]]) -> list[float]:
        """The rewards of several samples, each call given as (args, kwargs): the same values as
        awaiting each call, sent to a worker as one task.

        Each call through the pool costs the caller's process about 0.5 ms of CPU (pickling, the
        pool's feeder and manager threads, the result's way back: measured on 2 cores,
        2026-12-07), which in an asynchronous run is taken from the training thread through the
        GIL; one task per GRPO group pays it once. Each sample keeps its own timeout: a group that
        runs past `timeout_s` for every call in it (so only a hang, never a slow but valid reward),
        or whose worker dies, has its worker killed and each of its samples scored again alone,
        where only the calls that run past `timeout_s` score 0.0.
        """
        if len(calls) <= 1:
            return [await self(*args, **kwargs) for args, kwargs in calls]
        async with self._loop_slots():
            pool, generation = self._current_pool()
            try:
                future = asyncio.wrap_future(pool.submit(_call_many_in_worker, self.spec, calls))
                await self._until_workers_started(future)
                return await asyncio.wait_for(future, self.timeout_s * len(calls))
            except asyncio.TimeoutError:
                logger.warning(
                    "reward %r: a group of %d samples ran past %.1fs each; worker killed, scoring them one by one",
                    self.spec,
                    len(calls),
                    self.timeout_s,
                )
                self._replace_pool(generation)
            except BrokenProcessPool:
                self._replace_pool(generation)  # a no-op where another call replaced it already
        return list(await asyncio.gather(*(self(*args, **kwargs) for args, kwargs in calls)))

    def _loop_slots(self) -> asyncio.Semaphore:
        """A semaphore of `max_workers` slots for the running loop (one runner may see several)."""
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots_loop is not loop:
            self._slots, self._slots_loop = asyncio.Semaphore(self.max_workers), loop
        return self._slots

    def _current_pool(self) -> tuple[ProcessPoolExecutor, int]:
        """The pool (started if needed) and its generation."""
        if self._pool is None:
            self._start_pool()
        return self._pool, self._generation

    async def _until_workers_started(self, call: asyncio.Future) -> None:
        """Wait (up to startup_timeout_s) until `call` is done or every worker has started.

        The reward's timeout starts after this, so a worker's start (which re-imports the
        parent's main module, perhaps torch) is never mistaken for a hanging reward.
        """
        pending = [asyncio.wrap_future(f) for f in self._warmups if not f.done()]
        if not pending:
            return
        all_started = asyncio.gather(*pending, return_exceptions=True)
        await asyncio.wait([call, all_started], timeout=self.startup_timeout_s, return_when=asyncio.FIRST_COMPLETED)

    def _start_pool(self) -> None:
        """A fresh pool whose workers all start (and import the reward) right away.

        Starting workers takes descriptors (pipes, and the files the spawn reads); in a process
        out of them, the error names the limit rather than a bare `OSError: Too many open files`."""
        pool = None
        try:
            pool = _new_pool(self.max_workers)
            # Submitting max_workers tasks before any worker is idle spawns every worker now.
            warmups = [pool.submit(_warm, self.spec) for _ in range(self.max_workers)]
        except OSError as exc:
            if pool is not None:
                _kill_pool(pool)
            if is_out_of_files(exc):
                raise OpenFileLimitError(
                    f"reward {self.spec!r}: cannot start its {self.max_workers} worker process(es) "
                    f"({exc.strerror}): {out_of_files_text(exc)}"
                ) from exc
            raise
        self._pool, self._warmups = pool, warmups

    def _on_timeout(self, generation: int) -> None:
        self.n_timeouts += 1
        logger.warning(
            "reward %r ran past %.1fs: scored 0.0, worker killed and pool restarted (%d timeouts so far)",
            self.spec,
            self.timeout_s,
            self.n_timeouts,
        )
        self._replace_pool(generation)

    def _replace_pool(self, generation: int) -> None:
        """Kill the pool of `generation` and start another, once even if several calls ask."""
        if generation != self._generation or self._pool is None:
            return
        _kill_pool(self._pool)
        self._pool = None  # a start that fails leaves none, and the next call starts one again
        self._generation += 1
        self._start_pool()

    def close(self) -> None:
        """Stop the workers (hung ones included). The runner restarts a pool if called again."""
        if self._pool is not None:
            _kill_pool(self._pool)
            self._pool = None
            self._generation += 1

    def __enter__(self) -> "RewardRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_reward_with_timeout(
    fn: str | Callable[..., Any],
    timeout_s: float,
    *args,
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
    **kwargs,
) -> float:
    """One reward call in a fresh worker process: its value, or 0.0 with a warning on timeout.

    `fn` is a reward spec or a picklable module-level function. Starting a process per call
    costs about a second; anything that scores many samples should hold a `RewardRunner`.
    """
    pool = _new_pool(1)
    try:
        pool.submit(_warm, fn).result(timeout=startup_timeout_s)
        try:
            return pool.submit(_call_in_worker, fn, args, kwargs).result(timeout=timeout_s)
        except TimeoutError:
            logger.warning("reward %s ran past %.1fs: scored 0.0 and its worker was killed", _name(fn), timeout_s)
            return 0.0
    finally:
        _kill_pool(pool)
