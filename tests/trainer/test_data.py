"""train_dataset.max_prompt_len drops the records whose chat prompt is longer (it used to do nothing)."""

import pytest

from areal.config.data import DatasetConfig
from areal.trainer.data import load_records
from areal.workflow.common import chat_prompt_ids, load_tokenizer, record_messages


def prompt_len(tokenizer, record, system_prompt=None):
    return len(chat_prompt_ids(tokenizer, record_messages(record, system_prompt)))


def test_max_prompt_len_drops_longer_chat_prompts(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    everything = load_records(DatasetConfig(type="synthetic_word", split="test", kwargs={"size": 60}))
    lengths = sorted(prompt_len(tok, r) for r in everything)
    limit = lengths[len(lengths) // 2]
    cfg = DatasetConfig(type="synthetic_word", split="test", max_prompt_len=limit, kwargs={"size": 60})
    kept = load_records(cfg, tokenizer=tiny_model_dir)
    assert 0 < len(kept) < len(everything)
    assert kept == [r for r in everything if prompt_len(tok, r) <= limit]  # order kept
    # the system prompt counts: at the longest plain prompt's length, it pushes the longest out
    cfg.max_prompt_len = lengths[-1]
    assert len(load_records(cfg, tokenizer=tok)) == len(everything)
    with_system = load_records(cfg, tokenizer=tok, system_prompt="Hi.")
    assert 0 < len(with_system) < len(everything)
    assert all(prompt_len(tok, r, "Hi.") <= lengths[-1] for r in with_system)


def test_max_prompt_len_errors_name_the_key(tiny_model_dir):
    cfg = DatasetConfig(type="synthetic_word", split="test", max_prompt_len=3, kwargs={"size": 5})
    with pytest.raises(ValueError, match=r"valid_dataset.max_prompt_len=3: all 5 prompts are longer"):
        load_records(cfg, key="valid_dataset", tokenizer=tiny_model_dir)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        load_records(cfg)
