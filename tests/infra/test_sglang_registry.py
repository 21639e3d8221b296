"""Which SGLang model modules a server may skip (areal/infra/sglang_registry.py), read from a
stand-in of sglang/srt/models, and areal.models.serve setting SGLANG_DISABLED_MODEL_ARCHS in a
real process before it execs the server module."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from areal.infra.sglang_registry import disabled_model_archs, model_architectures, unused_model_modules

MODULES = {
    "llama": "class LlamaForCausalLM(nn.Module):\n    pass\nEntryClass = LlamaForCausalLM\n",
    "mistral": "from sglang.srt.models.llama import LlamaForCausalLM\nclass Mistral(LlamaForCausalLM): ...\n",
    "qwen2": "class Qwen2ForCausalLM: ...\nEntryClass = Qwen2ForCausalLM\n",
    "qwen2_eagle": "class Qwen2ForCausalLMEagle: ...\nEntryClass = [Qwen2ForCausalLMEagle]\n",
    "transformers": "class TransformersForCausalLM: ...\n",
    "gemma": "class GemmaForCausalLM: ...\n",
    "registry": "import pkgutil\n",
}


def models_dir(root: Path) -> Path:
    d = root / "sglang" / "srt" / "models"
    d.mkdir(parents=True)
    for name, text in MODULES.items():
        (d / f"{name}.py").write_text(text)
    return d


def model(root: Path, *archs: str) -> str:
    folder = root / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": list(archs)}))
    return str(folder)


def test_modules_that_name_no_architecture_are_skipped_and_the_fallback_kept(tmp_path):
    d = models_dir(tmp_path)
    assert unused_model_modules(d, ["LlamaForCausalLM"]) == ["gemma", "qwen2", "qwen2_eagle"]
    assert unused_model_modules(d, ["Qwen2ForCausalLM"]) == ["gemma", "llama", "mistral", "qwen2_eagle"]
    assert unused_model_modules(d, ["Qwen2ForCausalLM", "NoSuchModel"]) is None  # SGLang falls back: skip none


def test_the_environment_value_from_a_command_line(tmp_path):
    d = models_dir(tmp_path)
    path = model(tmp_path, "LlamaForCausalLM")
    value, note = disabled_model_archs(["--model-path", path, "--port", "1"], d)
    assert value == "gemma,qwen2,qwen2_eagle"
    assert note == "SGLang imports 4 of its 7 model modules, those naming LlamaForCausalLM"
    assert disabled_model_archs([f"--model-path={path}"], d)[0] == value
    assert disabled_model_archs(["--model-path", path, "--speculative-algorithm", "EAGLE"], d) is None
    assert disabled_model_archs(["--model-path", "Qwen/Qwen2.5-0.5B"], d) is None  # a hub id: not read
    assert model_architectures(str(tmp_path / "nowhere")) is None


def test_serve_sets_the_variable_before_exec_unless_the_user_did(tmp_path):
    models_dir(tmp_path)
    (tmp_path / "sglang" / "__init__.py").write_text("")
    (tmp_path / "sglang" / "show_env.py").write_text(
        "import os\nprint('DISABLED=' + os.environ.get('SGLANG_DISABLED_MODEL_ARCHS', '<unset>'))\n"
    )
    path = model(tmp_path, "Qwen2ForCausalLM")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    env.pop("SGLANG_DISABLED_MODEL_ARCHS", None)
    cmd = [sys.executable, "-m", "areal.models.serve", "--skip-unused-models", "sglang.show_env", "--model-path", path]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "DISABLED=gemma,llama,mistral,qwen2_eagle" in done.stdout
    assert "SGLang imports 3 of its 7 model modules, those naming Qwen2ForCausalLM" in done.stderr
    mine = subprocess.run(cmd, env={**env, "SGLANG_DISABLED_MODEL_ARCHS": "gemma"}, capture_output=True, text=True)
    assert "DISABLED=gemma\n" in mine.stdout and "is set already" in mine.stderr
    plain = subprocess.run(cmd[:3] + cmd[4:], env=env, capture_output=True, text=True, timeout=120)
    assert "DISABLED=<unset>" in plain.stdout  # without the option nothing is set


@pytest.mark.skipif(
    not (Path(__file__).parents[2] / ".sgl-parts").exists(), reason="the device kit's SGLang wheel is not here"
)
def test_against_sglangs_own_model_modules(tmp_path):
    """On a machine with the device kit (scripts: ../shared/tools/sglang-device): the modules of the
    real SGLang wheel that the project's architectures keep."""
    import zipfile

    wheel = next((Path(__file__).parents[2] / ".sgl-parts" / "c1").glob("sglang-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tmp_path, [n for n in z.namelist() if n.startswith("sglang/srt/models/") and n.count("/") == 3])
    d = tmp_path / "sglang" / "srt" / "models"
    total = len(list(d.glob("*.py")))
    for arch, own in (("LlamaForCausalLM", "llama"), ("Qwen2ForCausalLM", "qwen2")):
        unused = unused_model_modules(d, [arch])
        kept = {p.stem for p in d.glob("*.py")} - set(unused)
        assert {own, "transformers"} <= kept and len(kept) < total / 5, sorted(kept)
