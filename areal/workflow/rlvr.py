"""RLVR: one prompt, n sampled answers, each scored by a verifiable reward.

The episode renders the record through the chat template, generates `gconfig.n_samples`
answers concurrently, scores them with the reward function in a process pool, the group as one
task (RewardRunner.score_many: CPU-bound or hanging rewards neither block the event loop nor
stall it; a sample whose reward runs past the timeout scores 0), and
returns the group as tensors with a leading sample dimension:

    input_ids [n, L], attention_mask [n, L], loss_mask [n, L] (1 on generated tokens only),
    logprobs [n, L] (0 on the prompt), versions [n, L] (-1 on the prompt), rewards [n]
"""

from __future__ import annotations

import asyncio
from typing import Any

from areal.api.inference import InferenceEngine, ModelRequest
from areal.rollout.seeds import request_seed
from areal.workflow.common import (
    RewardedWorkflow,
    chat_prompt_ids,
    record_messages,
    reward_fields,
    score_all,
    stack_group,
)


class RLVRWorkflow(RewardedWorkflow):
    async def arun_episode(self, engine: InferenceEngine, data: dict[str, Any]) -> dict[str, Any]:
        prompt_ids = chat_prompt_ids(self.tokenizer, record_messages(data, self.system_prompt))
        req = ModelRequest.from_gconfig(prompt_ids, self.gconfig)
        resps = await asyncio.gather(
            *(engine.agenerate(req.copy(sampling_seed=request_seed(i))) for i in range(self.gconfig.n_samples))
        )
        prompt_text = self.tokenizer.decode(prompt_ids, skip_special_tokens=True)
        fields = reward_fields(data)
        texts = [self.tokenizer.decode(r.output_tokens, skip_special_tokens=True) for r in resps]
        calls = [((prompt_text, text, prompt_ids, r.output_tokens), fields) for text, r in zip(texts, resps)]
        rewards = await score_all(self.reward, calls)
        outputs = [(r.output_tokens, r.output_logprobs, r.output_versions) for r in resps]
        return stack_group(prompt_ids, outputs, [float(x) for x in rewards])
