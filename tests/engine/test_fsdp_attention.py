"""The packed attention on CPU: sequences of one length batched together give exactly what
causal SDPA over each sequence alone gives, forward and backward."""

import types

import pytest
import torch
import torch.nn.functional as F

from areal.engine.fsdp.attention import packed_sdpa_attention


def _per_sequence(q, k, v, lengths):
    outs = [
        F.scaled_dot_product_attention(a, b, c, is_causal=True, enable_gqa=True)
        for a, b, c in zip(q.split(lengths, 2), k.split(lengths, 2), v.split(lengths, 2))
    ]
    return torch.cat(outs, 2).transpose(1, 2)


@pytest.mark.parametrize("lengths", [[3, 5, 3, 5, 2, 3], [4, 4, 4], [1, 6, 2]])
def test_packed_attention_equals_each_sequence_alone(lengths):
    torch.manual_seed(0)
    total = sum(lengths)
    q = torch.randn(1, 4, total, 8, requires_grad=True)
    k = torch.randn(1, 2, total, 8, requires_grad=True)  # grouped-query: 2 kv heads for 4
    v = torch.randn(1, 2, total, 8, requires_grad=True)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    module = types.SimpleNamespace(training=True)
    out, _ = packed_sdpa_attention(module, q, k, v, None, cu_seq_lens_q=cu)
    expected = _per_sequence(q, k, v, lengths)
    assert out.shape == (1, total, 4, 8)
    assert torch.allclose(out, expected, atol=1e-6)
    weights = torch.randn_like(out)
    got = torch.autograd.grad((out * weights).sum(), (q, k, v))
    want = torch.autograd.grad((expected * weights).sum(), (q, k, v))
    for g, w in zip(got, want):
        assert torch.allclose(g, w, atol=1e-5)
