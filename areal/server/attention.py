"""Attention for the built-in server's decode steps: grouped-query attention without `repeat_kv`.

transformers' SDPA path (up to at least 5.17) copies every key/value head `num_key_value_groups`
times (`repeat_kv`) whenever an attention mask is given, and the server always gives one (its
batch is left-padded). For a decode step that copy is the whole cache: Qwen2.5-0.5B has 7 query
heads per KV head, so each step wrote and read the cache 7 times over in every layer.

A decode step has one query per head, so the query heads that share a KV head can act as that
head's queries instead: q [B, H, 1, D] viewed as [B, H_kv, G, D] attends to k/v [B, H_kv, L, D]
in one SDPA call, with the [B, 1, 1, L] padding mask broadcast over heads and queries. The
output is the same numbers, read from the cache once. Prefill (several query tokens) goes to
transformers' SDPA function unchanged. Registered under ATTN_IMPLEMENTATION, with transformers'
SDPA mask builder for prefill; decode steps pass their own 4-D mask (engine.ModelRunner.decode).
"""

from __future__ import annotations

ATTN_IMPLEMENTATION = "areal_server_sdpa"


def server_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
):
    """query [B, H, q, D], key/value [B, H_kv, L, D] -> ([B, q, H, D], None)."""
    import torch.nn.functional as F
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = int(getattr(module, "num_key_value_groups", 1))
    b, heads, q_len, dim = query.shape
    if q_len != 1 or groups == 1:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    grouped = query.reshape(b, heads // groups, groups, dim)  # query head h uses KV head h // groups
    out = F.scaled_dot_product_attention(grouped, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(b, heads, 1, dim).transpose(1, 2).contiguous(), None


def register() -> str:
    """Make ATTN_IMPLEMENTATION loadable by from_pretrained(attn_implementation=...); idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN_IMPLEMENTATION, server_attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
    return ATTN_IMPLEMENTATION
