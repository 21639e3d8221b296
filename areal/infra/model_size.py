"""How many parameters a model has, from its config.json alone (torch-free), so the launcher can
judge a memory split before any process starts.

The count covers decoder-only transformers written the Llama/Qwen2/Mistral way (embeddings,
attention with grouped key/value heads, a gated MLP, norms); other architectures give None and
are not judged.
"""

from __future__ import annotations

import json
from pathlib import Path

# Models named by preset instead of a folder (areal/models/resolve.py)
KNOWN_PARAMS = {"smollm2:135m-instruct": 134_515_008}
DECODER_TYPES = {"llama", "qwen2", "qwen3", "mistral"}


def parameter_count(path: str | None) -> int | None:
    """Parameters of the model at `path` (a Hugging Face folder or a known preset); None when
    unknown (hub ids, tiny: presets, other architectures)."""
    if not path:
        return None
    if path in KNOWN_PARAMS:
        return KNOWN_PARAMS[path]
    config = Path(path).expanduser() / "config.json"
    try:
        cfg = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    return decoder_parameters(cfg)


def decoder_parameters(cfg: dict) -> int | None:
    if cfg.get("model_type") not in DECODER_TYPES:
        return None
    try:
        h, layers, vocab = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["vocab_size"])
        heads, inter = int(cfg["num_attention_heads"]), int(cfg["intermediate_size"])
    except (KeyError, TypeError, ValueError):
        return None
    kv = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or h // heads)
    attention = h * heads * head_dim + 2 * h * kv * head_dim + heads * head_dim * h
    if cfg.get("attention_bias") or cfg.get("model_type") == "qwen2":  # q, k, v biases
        attention += heads * head_dim + 2 * kv * head_dim
    per_layer = attention + 3 * h * inter + 2 * h
    embeddings = vocab * h * (1 if cfg.get("tie_word_embeddings") else 2)
    return embeddings + layers * per_layer + h
