"""Random-weight models of real architectures, and batches for them, built locally (no download).

The benchmark scripts (scripts/bench_*.py) and the GPU tests measure the training step, the
weight update and the server on the shapes of real models (Qwen2.5-0.5B and 1.5B, from their
public config.json) with random weights, plus a `tiny` shape for CPU smoke runs. The scripts
beside this file import it directly (their folder is on sys.path when they run), the tests
through pytest's `pythonpath` (pyproject.toml):

    from model_shapes import SHAPES, build_model_dir, make_batch
    model_dir, tokenizer_dir = build_model_dir("qwen2.5-0.5b", Path("/tmp/areal-bench-train"))
    batch = make_batch(64, 256, 2048, vocab=SHAPES["qwen2.5-0.5b"]["vocab_size"])
"""

from __future__ import annotations

from pathlib import Path

# Public config values of the Qwen2.5 base models (config.json on the hub); both sizes share
# the vocabulary, tied embeddings and two key/value heads.
_QWEN25 = dict(num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)
SHAPES = {
    "qwen2.5-0.5b": dict(
        _QWEN25, hidden_size=896, num_hidden_layers=24, num_attention_heads=14, intermediate_size=4864
    ),
    "qwen2.5-1.5b": dict(
        _QWEN25, hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, intermediate_size=8960
    ),
    "tiny": dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=256,
        vocab_size=512,
        tie_word_embeddings=True,
    ),
}


# bf16 dense peak of one H200 as an 8192^3 torch.matmul reaches it (the datasheet says 989):
# the denominator of the benchmarks' MFU
PEAK_TFLOPS_H200 = 790.0


def matmul_params(cfg) -> int:
    """Parameters in matrix multiplications, lm_head included (cfg: a model config, or any object
    with its attributes, e.g. SimpleNamespace(**SHAPES[name]))."""
    h, i, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    kv = cfg.num_key_value_heads * (h // cfg.num_attention_heads)
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * i
    return layers * per_layer + h * cfg.vocab_size


def flops_per_token(cfg, avg_len: float) -> float:
    """Training FLOPs per token (forward + backward) at sequences of avg_len tokens: 6 x matmul
    parameters + 6 x layers x hidden x avg_len for causal attention."""
    return 6 * matmul_params(cfg) + 6 * cfg.num_hidden_layers * cfg.hidden_size * avg_len


def build_model_dir(shape: str, root: Path, dtype: str = "bfloat16") -> tuple[str, str]:
    """Random-weight Qwen2 folder of the given shape under `root`, and a tokenizer folder for it.

    The tokenizer is the project's character tokenizer (the engine needs one for padding and
    saving); token ids in benchmark batches are random over the model's vocabulary anyway. An
    existing model folder is reused.
    """
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from areal.models.tiny import make_tiny_model_dir

    root = Path(root)
    tok_dir = make_tiny_model_dir(root / "tokenizer")
    model_dir = root / shape
    if not (model_dir / "config.json").exists():
        config = Qwen2Config(max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6, **SHAPES[shape])
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
        model.save_pretrained(model_dir)
    return str(model_dir), str(tok_dir)


def make_grpo_batch(prompts: int, answers: int, prompt_len: int, answer_len: int, vocab: int, seed: int = 0) -> dict:
    """A GRPO-shaped batch: `answers` rows per prompt (adjacent), each a prompt of `prompt_len`
    random tokens shared by its group and an answer of up to `answer_len` (uniform from half of
    it); the loss on the answers only, as a rollout's loss_mask."""
    import torch

    g = torch.Generator().manual_seed(seed)
    n, width = prompts * answers, prompt_len + answer_len
    ids = torch.randint(3, vocab, (n, width), generator=g)
    ids[:, :prompt_len] = torch.randint(3, vocab, (prompts, prompt_len), generator=g).repeat_interleave(answers, 0)
    lengths = prompt_len + torch.randint(answer_len // 2, answer_len + 1, (n,), generator=g)
    pos = torch.arange(width)[None]
    attn = (pos < lengths[:, None]).long()
    return {"input_ids": ids * attn, "attention_mask": attn, "loss_mask": attn * (pos >= prompt_len).long()}


def make_batch(n: int, min_len: int, max_len: int, vocab: int, seed: int = 0) -> dict:
    """`n` right-padded rows of random token ids, lengths uniform in [min_len, max_len]."""
    import torch

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=g)
    pos = torch.arange(max_len)[None]
    attn = (pos < lengths[:, None]).long()
    ids = torch.randint(3, vocab, (n, max_len), generator=g) * attn
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": attn * (pos >= 1).long()}
