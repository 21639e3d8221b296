"""Which of SGLang's model modules a server the launcher starts need import
(launcher.sglang_skip_unused_models).

At every start SGLang's scheduler builds its model registry (sglang/srt/models/registry.py,
`import_model_classes`) by importing each module of sglang/srt/models, about 210 in 0.5.16,
to find the one class that serves the model's architecture; restarts and relaunches pay that
again. It skips the modules whose names SGLANG_DISABLED_MODEL_ARCHS lists (comma-separated). A
module can serve an architecture only if its source names the class (its `EntryClass`, or the
import that brings the class in), so every module whose text names none of the model's
architectures (config.json `architectures`) can be skipped; `transformers`, SGLang's fallback for
architectures it has no module of, is always kept. Nothing is skipped when the model's folder or
its architectures cannot be read, when an architecture is named by no module, or when a flag
may change the architecture SGLang loads (a speculative draft model, overridden config fields, a
non-native implementation). The modules are read as text: SGLang is not imported. Torch-free.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

ENV = "SGLANG_DISABLED_MODEL_ARCHS"
ALWAYS_KEEP = frozenset({"transformers", "registry", "__init__"})
# Flags under which SGLang may load another architecture than config.json's
ARCH_CHANGING_FLAGS = ("--speculative", "--json-model-override-args", "--model-impl")


def sglang_models_dir() -> Path | None:
    """sglang/srt/models of the installed SGLang, found without importing it."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "srt" / "models"
    return path if path.is_dir() else None


def model_architectures(model_path: str) -> list[str] | None:
    """config.json's `architectures` of a model folder; None for a hub id or an unreadable config."""
    try:
        archs = json.loads((Path(model_path) / "config.json").read_text()).get("architectures")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) and a for a in archs):
        return None
    return archs


def unused_model_modules(models_dir: Path, architectures: list[str]) -> list[str] | None:
    """The model modules (file stems, sorted) whose source names none of `architectures`, or None
    when some architecture is named by no module (SGLang then falls back to transformers: skip
    nothing)."""
    names = re.compile(r"\b(" + "|".join(re.escape(a) for a in architectures) + r")\b")
    unused, named = [], set()
    for path in sorted(models_dir.glob("*.py")):
        try:
            found = set(names.findall(path.read_text(errors="replace")))
        except OSError:
            return None
        named |= found
        if not found and path.stem not in ALWAYS_KEEP:
            unused.append(path.stem)
    return unused if named >= set(architectures) else None


def flag_value(args: list[str], flag: str) -> str | None:
    """The value of `flag` in an argument list (`--flag value` or `--flag=value`)."""
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def disabled_model_archs(args: list[str], models_dir: Path | None = None) -> tuple[str, str] | None:
    """(SGLANG_DISABLED_MODEL_ARCHS's value, a note for the log) for an SGLang command line, or
    None when every module should stay (module docstring)."""
    if any(arg.startswith(ARCH_CHANGING_FLAGS) for arg in args):
        return None
    model = flag_value(args, "--model-path")
    archs = model_architectures(model) if model else None
    models_dir = models_dir or sglang_models_dir()
    if not archs or models_dir is None:
        return None
    unused = unused_model_modules(models_dir, archs)
    if not unused:
        return None
    total = len(list(models_dir.glob("*.py")))
    note = f"SGLang imports {total - len(unused)} of its {total} model modules, those naming {', '.join(archs)}"
    return ",".join(unused), note
