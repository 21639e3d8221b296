"""Tiny causal LMs and a character tokenizer built locally (no hub downloads).

Tests, the CPU demo and benchmarks on this machine need a real transformers model and tokenizer
without network access.  `make_tiny_model_dir` writes a Hugging Face folder (config, random
weights, tokenizer with a chat template) that every part of the stack loads by path, exactly as
it would load a hub model:

    python -m areal.models.tiny /tmp/tiny-model            # build one by hand
"""

from __future__ import annotations

import argparse
from pathlib import Path

# Characters of the default vocabulary: enough for arithmetic prompts and GSM8K's "#### N" format.
DEFAULT_CHARSET = "0123456789+-*=#?: \nabcdefghijklmnopqrstuvwxyz"
PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
# Prompts go through a chat template like any instruct model; this one is minimal on purpose so
# a tiny model spends no capacity on it.
CHAT_TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"


def build_char_tokenizer(
    charset: str = DEFAULT_CHARSET,
    *,
    chat_template: str = CHAT_TEMPLATE,
    eos: str = EOS,
    extra_specials: tuple[str, ...] = (),
):
    """A PreTrainedTokenizerFast with one token per character plus pad/bos/eos and
    `extra_specials` (whole special tokens, e.g. ChatML's `<|im_start|>`)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = [PAD, BOS, eos, *extra_specials]
    vocab = {tok: i for i, tok in enumerate(specials)}
    for ch in dict.fromkeys(charset):  # keep order, drop repeats
        vocab.setdefault(ch, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    if extra_specials:  # matched whole, before the split into characters
        core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=eos,
        **({"additional_special_tokens": list(extra_specials)} if extra_specials else {}),
    )
    tok.chat_template = chat_template
    return tok


def tiny_model_config(
    vocab_size: int,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    max_position: int = 512,
    tie_word_embeddings: bool = True,
    bos_token_id: int = 1,
    eos_token_id: int = 2,
    pad_token_id: int = 0,
):
    """A Llama config scaled down to CPU size.

    Llama rather than Qwen2: transformers 5 forces Qwen2's byte-level tokenizer class onto any
    folder whose model_type is qwen2, which would mangle the character tokenizer below.
    """
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 4,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )


def make_tiny_model_dir(
    path: str | Path,
    *,
    charset: str = DEFAULT_CHARSET,
    seed: int = 0,
    dtype: str = "float32",
    chat_template: str | None = None,
    eos: str = EOS,
    extra_specials: tuple[str, ...] = (),
    **config_kwargs,
) -> Path:
    """Write a random-weight tiny Llama model and its tokenizer to `path`; returns the path.

    `chat_template` is Jinja text or a built-in name of areal.chat.template (`chatml_tools`);
    by default the minimal CHAT_TEMPLATE. Idempotent: an existing complete folder is left as it
    is, so tests can share one.
    """
    import torch
    from transformers import AutoModelForCausalLM

    path = Path(path)
    if (path / "config.json").exists() and (path / "tokenizer.json").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    template = CHAT_TEMPLATE
    if chat_template is not None:
        from areal.chat.template import resolve_chat_template

        template = resolve_chat_template(chat_template, key="chat_template")
    tok = build_char_tokenizer(charset, chat_template=template, eos=eos, extra_specials=tuple(extra_specials))
    config = tiny_model_config(
        len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **config_kwargs,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = make_tiny_model_dir(args.path, hidden_size=args.hidden_size, num_layers=args.num_layers, seed=args.seed)
    print(out)


if __name__ == "__main__":
    main()
