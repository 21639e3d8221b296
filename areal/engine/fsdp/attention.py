"""Attention over packed sequences without a T x T mask.

A packed micro-batch is one row holding several sequences. A dense block-diagonal mask makes
SDPA compute (and mask away) attention between every pair of the T tokens, which measured 1.7x
slower than a padded loop for Qwen2.5-0.5B on an H200 at T = 16k. This attention function runs
causal SDPA once per sequence instead (flash kernels on GPU, no mask), using the sequence
boundaries transformers already forwards to attention as `cu_seq_lens_q` (the kwarg its
flash-attention varlen path uses). Registered under ATTN_IMPLEMENTATION for any HF model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ATTN_IMPLEMENTATION = "areal_packed_sdpa"


def packed_sdpa_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask, dropout: float = 0.0, scaling: float | None = None,
                          is_causal: bool | None = None, **kwargs):
    """query [1, H, T, D], key/value [1, H_kv, T, D] -> ([1, T, H, D], None); causal per sequence."""
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        raise RuntimeError(f"attn_implementation={ATTN_IMPLEMENTATION!r} needs cu_seq_lens_q (packed "
                           "sequence boundaries); call the model through FSDPEngine")
    lengths = (cu[1:] - cu[:-1]).tolist()
    p = dropout if module.training else 0.0
    outs = [F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True, scale=scaling, enable_gqa=True)
            for q, k, v in zip(query.split(lengths, 2), key.split(lengths, 2), value.split(lengths, 2))]
    return torch.cat(outs, 2).transpose(1, 2).contiguous(), None


def register() -> str:
    """Make ATTN_IMPLEMENTATION loadable by from_pretrained(attn_implementation=...); idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, packed_sdpa_attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, _no_mask)
    return ATTN_IMPLEMENTATION


def _no_mask(*args, **kwargs):
    """The attention function needs no mask: causality and boundaries come from cu_seq_lens_q."""
    return None
