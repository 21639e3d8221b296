"""The inference-server command line, built from the sglang config section.

Both programs take the same flags: SGLang's `python -m sglang.launch_server` and the project's
built-in `python -m areal.server` (a subset). For SGLang, the installed version is checked and
flags it does not know are dropped with a warning naming each flag and the version.
"""

from __future__ import annotations

import re

from areal.config import ConfigError, ConfigIssue
from areal.config.sglang import SGLangConfig

MIN_SGLANG = "0.4.9.post2"
SERVER_MODULES = {"sglang": "sglang.launch_server", "builtin": "areal.server"}
# Fields of SGLangConfig the built-in server understands; the others are SGLang tuning knobs.
BUILTIN_FLAGS = {
    "model_path",
    "tokenizer_path",
    "dtype",
    "tp_size",
    "context_length",
    "mem_fraction_static",
    "random_seed",
    "host",
    "api_key",
    "log_level",
    "max_running_requests",
    "max_queued_requests",
    "max_prefill_tokens",
    "skip_tokenizer_init",
    "weight_dirs",
    "enable_memory_saver",
}
BUILTIN_ONLY = {"weight_dirs"}  # SGLang has no such flag
# Run-directory folders that hold weights a server may be told to load: disk weight updates
# (weight_sync.disk_update_path), recovery checkpoints (checkpoint.checkpoint_root) and saved
# models (TrainContext.save). The launcher allows exactly these (plus sglang.weight_dirs).
RUN_WEIGHT_SUBDIRS = ("weight_update", "checkpoints", "models")


def run_weight_dirs(run_dir: str) -> list[str]:
    return [f"{run_dir}/{sub}" for sub in RUN_WEIGHT_SUBDIRS]


def server_flags(cfg: SGLangConfig, *, port: int, kind: str) -> list[str]:
    """`--flag value` pairs for every set field (booleans become bare flags when true)."""
    args: list[str] = []
    values = cfg.model_dump()
    for name, value in values.items():
        if value is None or value is False:
            continue
        if (kind == "builtin" and name not in BUILTIN_FLAGS) or (kind != "builtin" and name in BUILTIN_ONLY):
            continue
        if value == []:
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, list):
            args += [flag, *map(str, value)]
        else:
            args += [flag] if value is True else [flag, str(value)]
    return args + ["--port", str(port)]


def indexed_server_command(
    cfg, index: int, *, port: int, kind: str, facts, warnings: list[str] | None = None
) -> list[str]:
    """The command of the run's server `index` (an ExperimentConfig, HostFacts): each server its
    own sampling seed (identical seeds give identical samples inside a GRPO group), and disk
    weight loads limited to the run's folders (built-in server)."""
    server_cfg = cfg.sglang.model_copy(
        update={
            "random_seed": cfg.sglang.random_seed + index,
            "weight_dirs": [*run_weight_dirs(cfg.run_dir), *cfg.sglang.weight_dirs],
        }
    )
    return server_command(
        server_cfg,
        port=port,
        kind=kind,
        python=facts.python,
        sglang_version=facts.sglang_version,
        sglang_flags=facts.sglang_flags,
        warnings=warnings,
    )


def server_command(
    cfg: SGLangConfig,
    *,
    port: int,
    kind: str,
    python: str,
    sglang_version: str | None = None,
    sglang_flags: frozenset[str] | None = None,
    warnings: list[str] | None = None,
) -> list[str]:
    flags = server_flags(cfg, port=port, kind=kind)
    if kind == "sglang":
        check_sglang_version(sglang_version)
        flags = drop_unknown_flags(flags, sglang_flags, sglang_version, warnings)
    return [python, "-m", SERVER_MODULES[kind], *flags]


def check_sglang_version(version: str | None) -> None:
    if version is None:
        raise ConfigError(
            [
                ConfigIssue(
                    "rollout.server",
                    "sglang",
                    "sglang is not installed",
                    "pip install 'sglang>=0.4.9.post2' on a GPU machine, or set rollout.server=builtin (or auto)",
                )
            ]
        )
    if _version_key(version) < _version_key(MIN_SGLANG):
        raise ConfigError(
            [
                ConfigIssue(
                    "rollout.server",
                    "sglang",
                    f"installed sglang {version} is older than {MIN_SGLANG}",
                    f"pip install -U 'sglang>={MIN_SGLANG}'",
                )
            ]
        )


def drop_unknown_flags(
    flags: list[str], known: frozenset[str] | None, version: str | None, warnings: list[str] | None
) -> list[str]:
    """Remove flags (with their value) the installed sglang lacks; each drop is a warning."""
    if known is None:
        return flags
    out, i = [], 0
    while i < len(flags):
        flag = flags[i]
        has_value = i + 1 < len(flags) and not flags[i + 1].startswith("--")
        if flag in known:
            out += flags[i : i + 1 + has_value]
        elif warnings is not None:
            warnings.append(f"sglang {version} has no flag {flag}; it is dropped from the server command")
        i += 1 + has_value
    return out


def _version_key(v: str) -> tuple:
    """Order versions like 0.4.9.post2 < 0.4.10 < 0.5.0rc1 < 0.5.0 without extra dependencies."""
    try:
        from packaging.version import Version

        return (Version(v),)
    except Exception:  # packaging missing or odd string: numeric fallback
        return tuple(int(x) for x in re.findall(r"\d+", v))
