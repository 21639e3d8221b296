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


def test_chat_preset_speaks_chatml_with_tools(tmp_path, monkeypatch):
    """tiny:chat: printable ASCII, ChatML markers as whole special tokens, end of turn as eos."""
    monkeypatch.setenv("AREAL_CACHE", str(tmp_path))
    from transformers import AutoConfig, AutoTokenizer

    path = resolve_model_path("tiny:chat")
    tok = AutoTokenizer.from_pretrained(path)
    ids = tok('<|im_start|>user\n{"a": [1]}<|im_end|>', add_special_tokens=False).input_ids
    assert len(ids) == 2 + len('user\n{"a": [1]}')
    assert tok.eos_token == "<|im_end|>" and AutoConfig.from_pretrained(path).eos_token_id == tok.eos_token_id
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {}}}]
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tools=tools, add_generation_prompt=True, tokenize=False
    )
    assert text.startswith('<|im_start|>system\nTools you can call:\n<tools>\n{"name": "calculator"')
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_changed_preset_builds_a_new_folder(tmp_path, monkeypatch):
    """A cached model of an older preset shape is never reused: the folder name carries the preset's digest."""
    from areal.models import resolve

    monkeypatch.setenv("AREAL_CACHE", str(tmp_path))
    before = resolve_model_path("tiny:arith")
    monkeypatch.setitem(resolve.TINY_PRESETS, "arith", {**resolve.TINY_PRESETS["arith"], "hidden_size": 32})
    after = resolve_model_path("tiny:arith")
    assert after != before
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(after).hidden_size == 32
    assert AutoConfig.from_pretrained(before).hidden_size == 128
