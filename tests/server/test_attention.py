"""The server's grouped-query decode attention gives transformers' SDPA numbers (repeat_kv path)
without copying the key/value heads."""

import types

import pytest

torch = pytest.importorskip("torch")

from areal.server.attention import ATTN_IMPLEMENTATION, server_attention  # noqa: E402


def _reference(module, q, k, v, mask):
    """Each query head against its KV head, repeated explicitly, one SDPA call per head."""
    groups = module.num_key_value_groups
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out.transpose(1, 2)


@pytest.mark.parametrize("groups", [1, 2, 7])
def test_decode_step_matches_repeated_heads_with_left_padding(groups):
    torch.manual_seed(0)
    b, kv_heads, length, dim = 3, 2, 11, 16
    module = types.SimpleNamespace(num_key_value_groups=groups, is_causal=True, training=False)
    q = torch.randn(b, kv_heads * groups, 1, dim)
    k, v = torch.randn(b, kv_heads, length, dim), torch.randn(b, kv_heads, length, dim)
    pad = torch.tensor([0, 4, 9])  # left padding per row; the last row sees 2 keys
    mask = (torch.arange(length)[None] >= pad[:, None])[:, None, None, :]
    out, _ = server_attention(module, q, k, v, mask, scaling=dim**-0.5)
    assert out.shape == (b, 1, kv_heads * groups, dim)
    torch.testing.assert_close(out, _reference(module, q, k, v, mask), atol=1e-5, rtol=1e-5)
    # padded keys do not matter: changing them leaves the output as it is
    k2, v2 = k.clone(), v.clone()
    k2[2, :, :9], v2[2, :, :9] = 100.0, -100.0
    out2, _ = server_attention(module, q, k2, v2, mask, scaling=dim**-0.5)
    torch.testing.assert_close(out2, out)


def test_prefill_goes_through_transformers_sdpa():
    torch.manual_seed(1)
    module = types.SimpleNamespace(num_key_value_groups=2, is_causal=True, training=False)
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    out, _ = server_attention(module, q, k, v, None, scaling=8**-0.5)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True
    ).transpose(1, 2)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_runner_serves_with_the_grouped_attention(varied_model_dir):
    from areal.server.engine import ModelRunner

    runner = ModelRunner(varied_model_dir, dtype="float32", device="cpu")
    assert runner.model.config._attn_implementation == ATTN_IMPLEMENTATION
    assert runner.config.num_attention_heads > runner.config.num_key_value_heads  # GQA is exercised
