"""Multi-turn RLVR: answer, get feedback when wrong, retry, up to max_turns attempts.

Each sample is one conversation: the model answers; if the reward is not positive and turns are
left, a user feedback message is appended and the model answers again, seeing its earlier
attempts. The sample's reward is the last attempt's reward times `turn_discount ** retries`
(the discount starts at 1, so a first-turn correct answer gets the full reward).

The trajectory is the whole conversation as one token sequence; loss_mask is 1 on the tokens the
model generated in every turn and 0 on the prompt and the feedback messages, whose logprobs are 0
and versions -1. Tokens are appended as generated (never re-tokenized from text), so the trainer
scores exactly the tokens the servers produced.
"""

from __future__ import annotations

import asyncio
from typing import Any

from areal.api.inference import InferenceEngine, ModelRequest
from areal.rollout.seeds import request_seed
from areal.workflow.common import (
    RewardedWorkflow,
    chat_prompt_ids,
    encode,
    generated,
    record_messages,
    render,
    reward_fields,
    stack_samples,
    trajectory,
)

DEFAULT_FEEDBACK = "Your answer is wrong or could not be parsed. Please try again."


class MultiTurnWorkflow(RewardedWorkflow):
    def __init__(
        self,
        reward_fn,
        gconfig,
        tokenizer,
        *,
        max_turns: int = 2,
        turn_discount: float = 1.0,
        feedback: str = DEFAULT_FEEDBACK,
        system_prompt: str | None = None,
        reward_timeout_s: float = 15.0,
        reward_workers: int = 2,
    ):
        if max_turns < 1:
            raise ValueError(f"workflow.max_turns must be >= 1, got {max_turns}")
        if not 0 < turn_discount <= 1:
            raise ValueError(f"workflow.turn_discount must be in (0, 1], got {turn_discount}")
        super().__init__(
            reward_fn,
            gconfig,
            tokenizer,
            system_prompt=system_prompt,
            reward_timeout_s=reward_timeout_s,
            reward_workers=reward_workers,
        )
        self.max_turns = max_turns
        self.turn_discount = turn_discount
        self.feedback = feedback

    @classmethod
    def from_config(cls, cfg, tokenizer, **kwargs) -> "MultiTurnWorkflow":
        wf = cfg.workflow
        return super().from_config(cfg, tokenizer, max_turns=wf.max_turns, turn_discount=wf.turn_discount, **kwargs)

    async def arun_episode(self, engine: InferenceEngine, data: dict[str, Any]) -> dict[str, Any]:
        # one sampling seed per conversation, for all its turns (their positions differ)
        results = await asyncio.gather(
            *(self._conversation(engine, data, request_seed(i)) for i in range(self.gconfig.n_samples))
        )
        return stack_samples([s for s, _ in results], [r for _, r in results])

    async def _conversation(
        self, engine: InferenceEngine, data: dict[str, Any], seed: int | None = None
    ) -> tuple[dict, float]:
        messages = record_messages(data, self.system_prompt)
        prompt_ids = chat_prompt_ids(self.tokenizer, messages)
        prompt_text = self.tokenizer.decode(prompt_ids, skip_special_tokens=True)
        fields = reward_fields(data)
        seq, segments, discount = list(prompt_ids), [], 1.0
        for turn in range(self.max_turns):
            resp = await engine.agenerate(ModelRequest.from_gconfig(seq, self.gconfig, sampling_seed=seed))
            segments.append(generated(resp))
            seq += resp.output_tokens
            completion = self.tokenizer.decode(resp.output_tokens, skip_special_tokens=True)
            reward = float(await self.reward(prompt_text, completion, prompt_ids, resp.output_tokens, **fields))
            if reward > 0 or turn == self.max_turns - 1:
                break
            feedback_ids = self._feedback_ids(messages, resp.output_tokens, completion)
            messages += [{"role": "assistant", "content": completion}, {"role": "user", "content": self.feedback}]
            segments.append((feedback_ids, [], [], False))
            seq += feedback_ids
            discount *= self.turn_discount
        return trajectory(prompt_ids, segments), reward * discount

    def _feedback_ids(self, messages: list[dict], output_ids: list[int], completion: str) -> list[int]:
        """Tokens that close the model's turn and open the next: the chat template's text after
        what the model has produced, so the conversation reads as the template renders it."""
        tok = self.tokenizer
        feedback = {"role": "user", "content": self.feedback}
        answer = {"role": "assistant", "content": completion}
        full = render(tok, messages + [answer, feedback], add_generation_prompt=True)
        so_far = render(tok, messages, add_generation_prompt=True) + tok.decode(output_ids, skip_special_tokens=False)
        if full.startswith(so_far):
            return encode(tok, full[len(so_far) :])
        closed = render(tok, messages + [answer], add_generation_prompt=False)
        if full.startswith(closed):  # the model stopped without the template's end-of-turn text
            return encode(tok, full[len(closed) :])
        return encode(tok, render(tok, [feedback], add_generation_prompt=True))
