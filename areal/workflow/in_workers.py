"""A workflow whose episodes run in worker processes, off the trainer's GIL.

An RLVR episode is Python too: the chat template, the HTTP client of the servers (aiohttp, JSON
of every token's logprob), the tokenizer's decode for the reward. In the trainer's process that
work shares the GIL with the training thread: on one H200, during the SmolLM2 recipe's recompute
pass on SGLang, the trainer's other threads used 0.19 s of CPU against the main thread's 0.78 s
(`cpu/recompute_logprob_others_s`, 40 steps, 2026-12-04), where the agent recipe with its
episodes in a worker process used 0.014 s.

WorkflowInWorkers wraps the recipe of any workflow (a picklable callable that builds it, e.g.
`functools.partial(build_workflow, cfg, tokenizer_path)`) and sends each episode to
areal.rollout.episode_workers.EpisodeWorkers, started on first use for the engine's servers. The
trainer keeps admission, pauses and the batches; the workers build their own copy of the workflow
and their own client.
"""

from __future__ import annotations

import asyncio
import pickle
from typing import Any, Callable

from areal.api.inference import InferenceEngine
from areal.api.workflow import RolloutWorkflow


class WorkflowInWorkers(RolloutWorkflow):
    def __init__(
        self,
        recipe: Callable[[], RolloutWorkflow],
        workers: int,
        *,
        key: str = "workflow.workers",
        name: str = "episode-worker",
        inner_name: str = "",
        open_files: int = 0,
        open_files_keys: str = "",
        unpicklable_hint: str = "",
    ):
        """`recipe`: builds the in-process workflow in each worker (it must pickle: an importable
        callable and plain arguments); `workers`: how many processes (`key` names the setting);
        `inner_name`: the class the recipe builds, for errors (RolloutError names it);
        `open_files`: descriptors each worker needs (areal.infra.sockets)."""
        if workers < 1:
            raise ValueError(f"{key}={workers}: WorkflowInWorkers needs at least one worker process")
        check_picklable(recipe, key, unpicklable_hint)
        self.recipe, self.workers, self.key, self.name = recipe, workers, key, name
        self.open_files, self.open_files_keys = open_files, open_files_keys
        self._pool = None
        self.workflow_name = f"{inner_name or 'workflow'} in {key}={workers} processes"

    @property
    def pool(self):
        """The worker processes (an EpisodeWorkers) once the first episode started them, else None."""
        return self._pool

    async def arun_episode(self, engine: InferenceEngine, data: dict[str, Any]) -> dict[str, Any] | None:
        from areal.rollout.seeds import episode_seed

        return await self.pool_for(engine).run(data, episode_seed())

    def pool_for(self, engine):
        """The worker processes for `engine`'s servers (started by their first episode)."""
        if self._pool is None or self._pool.engine is not engine:
            from areal.rollout.episode_workers import EpisodeWorkers

            if self._pool is not None:
                self._pool.close()
            self._pool = EpisodeWorkers(
                self.recipe,
                engine,
                self.workers,
                name=self.name,
                open_files=self.open_files,
                open_files_keys=self.open_files_keys,
            )
        return self._pool

    def close(self) -> None:
        """Stop the worker processes (each closes its workflow and client first)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)


def check_picklable(recipe: Callable, key: str, hint: str = "") -> None:
    """Worker processes receive the recipe pickled: a lambda, a closure or a live object with
    locks or sockets cannot travel. Say so at construction, naming the setting."""
    try:
        pickle.dumps(recipe)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        what = getattr(getattr(recipe, "func", recipe), "__qualname__", type(recipe).__name__)
        raise ValueError(
            f"{key} > 0 builds the workflow again in each worker process, and its recipe ({what} and its "
            f"arguments) cannot be sent there ({exc}): "
            f"{hint or 'build it from importable names and plain arguments'}, or set {key}=0"
        ) from exc
