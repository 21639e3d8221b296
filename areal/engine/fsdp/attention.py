"""Attention over packed sequences without a T x T mask.

On CUDA in bf16/fp16, one call of torch's variable-length flash attention
(torch.nn.attention.varlen) covers the whole packed row; elsewhere (CPU, fp32, older torch)
causal SDPA runs once per sequence.

A packed micro-batch is one row holding several sequences. A dense block-diagonal mask makes
SDPA compute (and mask away) attention between every pair of the T tokens: T x T work where the
sequences need only the sum of their own lengths squared. This attention function runs
causal SDPA once per sequence instead (flash kernels on GPU, no mask), using the sequence
boundaries transformers already forwards to attention as `cu_seq_lens_q` (the kwarg its
flash-attention varlen path uses). Registered under ATTN_IMPLEMENTATION for any HF model.
"""

from __future__ import annotations

import functools
import inspect
import logging

import torch
import torch.nn.functional as F

logger = logging.getLogger("areal.attention")
_VARLEN = {"enabled": True}

ATTN_IMPLEMENTATION = "areal_packed_sdpa"


def packed_sdpa_attention(
    module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
):
    """query [1, H, T, D], key/value [1, H_kv, T, D] -> ([1, T, H, D], None); causal per sequence."""
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        raise RuntimeError(
            f"attn_implementation={ATTN_IMPLEMENTATION!r} needs cu_seq_lens_q (packed "
            "sequence boundaries); call the model through FSDPEngine"
        )
    p = dropout if module.training else 0.0
    kv_index = kwargs.get("areal_kv_index")
    if kv_index is not None:  # shared prompts (shared_prompts.py): each segment's keys gathered
        return _segments_attention(query, key, value, kv_index, kwargs, p, scaling), None
    if p == 0.0 and _varlen_usable(query):
        try:
            return _varlen(query, key, value, cu, kwargs.get("max_length_q"), scaling), None
        except (RuntimeError, TypeError, ValueError) as exc:  # kernel or signature not available
            _disable_varlen(exc)
    lengths = (cu[1:] - cu[:-1]).tolist()
    if len(set(lengths)) < len(lengths):
        return _sdpa_by_length(query, key, value, cu[:-1].tolist(), lengths, p, scaling), None
    outs = [
        F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True, scale=scaling, enable_gqa=True)
        for q, k, v in zip(query.split(lengths, 2), key.split(lengths, 2), value.split(lengths, 2))
    ]
    return torch.cat(outs, 2).transpose(1, 2).contiguous(), None


def _segments_attention(query, key, value, kv_index: torch.Tensor, kwargs: dict, p: float, scaling):
    """Attention of query segments (cu_seq_lens_q) over gathered key segments (kv_index,
    cu_seq_lens_k), each segment's queries aligned with the end of its keys (a tail after its
    shared prompt sees the whole prompt). [1, H, T, D] -> [1, T, H, D]."""
    key, value = key.index_select(2, kv_index), value.index_select(2, kv_index)
    cu_q, cu_k = kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"]
    if p == 0.0 and _varlen_usable(query):
        try:
            max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
            return _varlen(query, key, value, cu_q, max_q, scaling, cu_k, max_k)
        except (RuntimeError, TypeError, ValueError) as exc:
            _disable_varlen(exc)
    q_lens, k_lens = (cu_q[1:] - cu_q[:-1]).tolist(), (cu_k[1:] - cu_k[:-1]).tolist()
    outs = []
    for q, k, v in zip(query.split(q_lens, 2), key.split(k_lens, 2), value.split(k_lens, 2)):
        lq, lk = q.shape[2], k.shape[2]
        # query i sees keys up to lk - lq + i: causal, aligned with the end of the key range
        mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, scale=scaling, enable_gqa=True)
        outs.append(out)
    return torch.cat(outs, 2).transpose(1, 2).contiguous()


def _sdpa_by_length(query, key, value, starts: list[int], lengths: list[int], p: float, scaling):
    """Causal SDPA once per distinct sequence length, the sequences of that length stacked as a
    batch: many short rollouts of few lengths (small models, CPU) cost a handful of calls instead
    of one call each. [1, H, T, D] -> [1, T, H, D]."""
    buckets: dict[int, list[int]] = {}
    for start, length in zip(starts, lengths):
        buckets.setdefault(length, []).extend(range(start, start + length))
    order = torch.tensor([t for positions in buckets.values() for t in positions], device=query.device)
    outs = []
    offset = 0
    for length, positions in buckets.items():
        idx = order[offset : offset + len(positions)]
        offset += len(positions)
        q, k, v = (_stack_sequences(t, idx, length) for t in (query, key, value))
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True, scale=scaling, enable_gqa=True)
        outs.append(out.transpose(0, 1).reshape(out.shape[1], -1, out.shape[3]))  # [H, n * L, D]
    packed = torch.cat(outs, 1)[:, torch.argsort(order)]  # back to the packed token order
    return packed.transpose(0, 1).unsqueeze(0).contiguous()


def _stack_sequences(t: torch.Tensor, idx: torch.Tensor, length: int) -> torch.Tensor:
    """[1, H, T, D] and the positions of n sequences of one length -> [n, H, length, D]."""
    picked = t[0].index_select(1, idx)  # [H, n * length, D]
    return picked.view(t.shape[1], -1, length, t.shape[3]).transpose(0, 1)


def _varlen_usable(query: torch.Tensor) -> bool:
    return (
        _VARLEN["enabled"]
        and query.is_cuda
        and query.dtype in (torch.bfloat16, torch.float16)
        and _varlen_fn() is not None
    )


def _varlen_fn():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


@functools.cache
def _params_of(fn) -> frozenset[str]:
    """fn's parameter names, read once: the attention runs per layer and micro-batch (18 us a read)."""
    return frozenset(inspect.signature(fn).parameters)


def _disable_varlen(exc: Exception) -> None:
    _VARLEN["enabled"] = False
    logger.warning("variable-length flash attention failed (%s); using causal SDPA per sequence", exc)


def _varlen(query, key, value, cu, max_len, scaling, cu_k=None, max_len_k=None):
    """[1, H, T, D] q/k/v -> [1, T, H, D] through one varlen flash-attention call (causal; where
    cu_k gives other key segments, each query segment aligned with the end of its keys, as flash
    attention aligns a causal mask when the lengths differ)."""
    fn = _varlen_fn()
    params = _params_of(fn)
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [T, H, D]
    if k.shape[1] != q.shape[1] and "enable_gqa" not in params:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    extra = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
    if "window_size" in params:
        extra["window_size"] = (-1, 0)  # causal
    elif "is_causal" in params:
        extra["is_causal"] = True
    else:
        raise TypeError("torch.nn.attention.varlen.varlen_attn has no causal option")
    cu = cu.to(torch.int32)
    max_len = int(max_len) if max_len is not None else int((cu[1:] - cu[:-1]).max())
    if cu_k is None:
        cu_k, max_len_k = cu, max_len
    else:
        cu_k = cu_k.to(torch.int32)
        max_len_k = int(max_len_k) if max_len_k is not None else int((cu_k[1:] - cu_k[:-1]).max())
    out = fn(q, k, v, cu, cu_k, max_len, max_len_k, scale=scaling, **extra)
    return out.unsqueeze(0)


def register(compiled: bool = False) -> str:
    """Make ATTN_IMPLEMENTATION loadable by from_pretrained(attn_implementation=...); idempotent.

    compiled: the decoder layers will run under torch.compile (actor.compile); the attention call
    then stays outside the graphs (a graph break), since its kernel choice is Python."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    _VARLEN["compiled"] = _VARLEN.get("compiled", False) or compiled  # sticky: one registry per process
    fn = torch.compiler.disable(packed_sdpa_attention) if _VARLEN["compiled"] else packed_sdpa_attention
    AttentionInterface.register(ATTN_IMPLEMENTATION, fn)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, _no_mask)
    return ATTN_IMPLEMENTATION


def _no_mask(*args, **kwargs):
    """The attention function needs no mask: causality and boundaries come from cu_seq_lens_q."""
    return None
