import threading

from areal.models.resolve import resolve_model_path
from areal.models.tiny import build_char_tokenizer


def test_char_tokenizer_round_trips_and_keeps_spaces():
    tok = build_char_tokenizer()
    ids = tok("#### 12\n3+4=", add_special_tokens=False).input_ids
    assert len(ids) == len("#### 12\n3+4=")
    assert tok.decode(ids) == "#### 12\n3+4="


def test_tiny_preset_builds_once_and_loads_with_auto_classes(tmp_path, monkeypatch):
    monkeypatch.setenv("AREAL_CACHE", str(tmp_path))
    paths = []
    threads = [threading.Thread(target=lambda: paths.append(resolve_model_path("tiny:arith"))) for _ in range(3)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len(set(paths)) == 1
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(paths[0])
    model = AutoModelForCausalLM.from_pretrained(paths[0])
    assert model.config.vocab_size == len(tok) == 3 + len("0123456789+=# \n")
    text = tok.apply_chat_template([{"role": "user", "content": "3+4="}], add_generation_prompt=True, tokenize=False)
    assert text == "<bos>3+4="
    assert resolve_model_path("/some/folder") == "/some/folder"


def test_unknown_tiny_preset_is_a_clear_error():
    import pytest

    with pytest.raises(ValueError, match="unknown tiny preset 'nope'"):
        resolve_model_path("tiny:nope")
