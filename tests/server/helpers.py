"""Reference helpers shared by the server tests."""

import random


def hf_greedy(model, prompt, max_new_tokens):
    """transformers' greedy generate; the new tokens only (stops at EOS like the server)."""
    import torch

    ids = torch.tensor([prompt])
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=0
    )
    return out[0, len(prompt) :].tolist()


def prompt_ids(seed, length):
    """A reproducible prompt: bos then `length - 1` character tokens."""
    rng = random.Random(seed)
    return [1] + [rng.randrange(3, 40) for _ in range(length - 1)]
