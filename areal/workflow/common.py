"""Pieces both built-in workflows use: their shared base (RewardedWorkflow), tokenizer loading,
chat prompts, rewards, trajectories.

Prompts are rendered to text by the tokenizer's chat template and then tokenized without special
tokens: the template already holds bos/eos where the model expects them (and transformers 5's
`apply_chat_template(tokenize=True)` returns a BatchEncoding rather than ids).
"""

from __future__ import annotations

import asyncio
from typing import Any

from areal.api.inference import ModelResponse
from areal.api.workflow import RolloutWorkflow
from areal.chat.template import encode_text as encode

# Reward functions take these four positionally; record fields with the same names are not passed.
REWARD_ARGS = ("prompt", "completion", "prompt_ids", "completion_ids")


class RewardedWorkflow(RolloutWorkflow):
    """What the RLVR and multi-turn workflows hold alike: a reward runner, the generation config, a
    tokenizer and an optional system prompt, taken from the experiment config by `from_config`."""

    def __init__(
        self,
        reward_fn,
        gconfig,
        tokenizer,
        *,
        system_prompt: str | None = None,
        reward_timeout_s: float = 15.0,
        reward_workers: int = 2,
    ):
        """`reward_fn`: a reward spec (name or 'module:function') or a RewardRunner;
        `gconfig`: a GenerationConfig; `tokenizer`: a tokenizer or its path."""
        self.reward = make_reward_runner(reward_fn, reward_timeout_s, reward_workers)
        self.gconfig = gconfig
        self.tokenizer = load_tokenizer(tokenizer)
        self.system_prompt = system_prompt

    @classmethod
    def from_config(cls, cfg, tokenizer, **kwargs):
        wf = cfg.workflow
        return cls(
            wf.reward_fn,
            cfg.gconfig,
            tokenizer,
            system_prompt=wf.system_prompt,
            reward_timeout_s=wf.reward_timeout_s,
            reward_workers=wf.reward_workers,
            **kwargs,
        )

    def close(self) -> None:
        """Stop the reward worker processes."""
        if hasattr(self.reward, "close"):
            self.reward.close()

    async def aclose(self) -> None:
        """close() from the loop the episodes ran on (an episode worker's, as it stops)."""
        await asyncio.to_thread(self.close)


def load_tokenizer(tokenizer):
    """A tokenizer object, or one loaded from a path / hub id."""
    if isinstance(tokenizer, str):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(tokenizer)
    return tokenizer


def record_messages(data: dict[str, Any], system_prompt: str | None = None) -> list[dict[str, str]]:
    """The chat of a dataset record: its `messages`, else `question` (or `prompt`) as a user turn."""
    if data.get("messages"):
        messages = [dict(m) for m in data["messages"]]
    else:
        text = data.get("question", data.get("prompt"))
        if not isinstance(text, str):
            raise ValueError(
                f"record has no 'messages', 'question' or 'prompt' text to prompt with; its keys are {sorted(data)}"
            )
        messages = [{"role": "user", "content": text}]
    if system_prompt and messages[0].get("role") != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def render(tokenizer, messages: list[dict], *, add_generation_prompt: bool) -> str:
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template; "
            "use an instruct model or set tokenizer.chat_template"
        )
    return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)


def chat_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    return encode(tokenizer, render(tokenizer, messages, add_generation_prompt=True))


def reward_fields(data: dict[str, Any]) -> dict[str, Any]:
    """The record's fields as reward keyword arguments (minus the four positional names)."""
    return {k: v for k, v in data.items() if k not in REWARD_ARGS}


async def score_all(reward, calls: list[tuple[tuple, dict]]) -> list[float]:
    """The rewards of several samples, calls given as (args, kwargs): in one worker task where the
    runner can (RewardRunner.score_many), else call by call at once."""
    many = getattr(reward, "score_many", None)
    if many is not None:
        return list(await many(calls))
    return list(await asyncio.gather(*(reward(*args, **kwargs) for args, kwargs in calls)))


def make_reward_runner(reward, timeout_s: float, workers: int):
    """A RewardRunner from a spec, or the given runner as it is."""
    if isinstance(reward, str):
        from areal.reward.runner import RewardRunner

        return RewardRunner(reward, timeout_s=timeout_s, max_workers=workers)
    return reward


def trajectory(prompt_ids: list[int], segments: list[tuple[list[int], list[float], list[int], bool]]) -> dict:
    """Per-token lists of one sample: the prompt, then segments (ids, logprobs, versions, trained).

    Prompt and untrained segments (e.g. feedback messages) get loss_mask 0, logprob 0 and
    version -1; generated segments keep their logprobs and versions with loss_mask 1.
    """
    ids, loss, lps, vers = list(prompt_ids), [0] * len(prompt_ids), [0.0] * len(prompt_ids), [-1] * len(prompt_ids)
    for seg_ids, seg_lps, seg_vers, trained in segments:
        ids += seg_ids
        loss += [int(trained)] * len(seg_ids)
        lps += seg_lps if trained else [0.0] * len(seg_ids)
        vers += seg_vers if trained else [-1] * len(seg_ids)
    return {"input_ids": ids, "loss_mask": loss, "logprobs": lps, "versions": vers}


def generated(resp: ModelResponse) -> tuple[list[int], list[float], list[int], bool]:
    return resp.output_tokens, resp.output_logprobs, resp.output_versions, True


def stack_group(
    prompt_ids: list[int], outputs: list[tuple[list[int], list[float], list[int]]], rewards: list[float]
) -> dict:
    """What stack_samples gives for samples [trajectory(prompt_ids, [(ids, logprobs, versions,
    True)]) ...], built without per-token Python lists: a GRPO group's samples share their
    prompt, converted once. In an async run this runs on the rollout thread, and every
    millisecond it holds the GIL is one the training thread waits (4-5% of the client's CPU a
    sample in scripts/bench_rollout_client.py, docs/benchmarks.md section 8)."""
    import numpy as np
    import torch

    n, p = len(outputs), len(prompt_ids)
    ends = np.array([p + len(ids) for ids, _, _ in outputs], dtype=np.int64)
    width = int(ends.max(initial=p))
    input_ids = np.zeros((n, width), dtype=np.int64)
    input_ids[:, :p] = np.asarray(prompt_ids, dtype=np.int64)
    logprobs = np.zeros((n, width), dtype=np.float32)
    versions = np.full((n, width), -1, dtype=np.int64)
    for i, (ids, lps, vers) in enumerate(outputs):
        input_ids[i, p : ends[i]] = ids
        logprobs[i, p : ends[i]] = lps
        versions[i, p : ends[i]] = vers
    columns = np.arange(width)
    loss_mask = ((columns >= p) & (columns < ends[:, None])).astype(np.int64)
    return {
        "input_ids": torch.from_numpy(input_ids),
        "attention_mask": torch.from_numpy((columns < ends[:, None]).astype(np.int64)),
        "loss_mask": torch.from_numpy(loss_mask),
        "logprobs": torch.from_numpy(logprobs),
        "versions": torch.from_numpy(versions),
        "rewards": torch.tensor(rewards, dtype=torch.float32),
    }


def stack_samples(samples: list[dict], rewards: list[float]) -> dict:
    """Tensors [n, L] (right-padded) of per-token lists, attention_mask, and rewards [n]."""
    import torch

    from areal.rollout.batch import pad_sequences

    input_ids = pad_sequences([s["input_ids"] for s in samples], 0, torch.long)
    lengths = torch.tensor([len(s["input_ids"]) for s in samples], dtype=torch.long)
    out = {
        "input_ids": input_ids,
        "attention_mask": (torch.arange(input_ids.shape[1]) < lengths[:, None]).long(),
        "loss_mask": pad_sequences([s["loss_mask"] for s in samples], 0, torch.long),
        "logprobs": pad_sequences([s["logprobs"] for s in samples], 0.0, torch.float32),
        "versions": pad_sequences([s["versions"] for s in samples], -1, torch.long),
        "rewards": torch.tensor(rewards, dtype=torch.float32),
    }
    return out
