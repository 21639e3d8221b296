"""A workflow for tests/rollout/test_episode_workers_drain.py, importable by an episode worker."""

from areal.api.inference import ModelRequest
from areal.api.workflow import RolloutWorkflow

LONG = 30000  # new tokens: the generation can only end by an abort (or the worker's end)


class LongGeneration(RolloutWorkflow):
    """One generation of LONG tokens, the end-of-sequence token ignored."""

    async def arun_episode(self, engine, data):
        await engine.agenerate(
            ModelRequest(input_ids=[1, 2, 3], max_new_tokens=LONG, min_new_tokens=LONG, ignore_eos=True)
        )
        return None
