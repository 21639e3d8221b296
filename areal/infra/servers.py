"""The inference-server command line, built from the sglang config section.

Both programs take the same flags: SGLang's `python -m sglang.launch_server` and the project's
built-in `python -m areal.server` (a subset). For SGLang, the installed version is checked and
flags it does not know are dropped with a warning naming each flag and the version.
"""

from __future__ import annotations

import re

from areal.config import ConfigError, ConfigIssue
from areal.config.sglang import SGLangConfig

from .model_names import is_project_model

# The oldest SGLang whose routes and fields the client uses all exist (/model_info, /server_info,
# flush_cache on every weight route, extra_key in /generate, the three pause modes), read from its
# source; TESTED_SGLANG are the releases the gpu-marked tests ran against on the device machine.
MIN_SGLANG = "0.5.9"
TESTED_SGLANG = ("0.5.16",)
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
# sglang.cuda_graph_max_bs when null: SGLang 0.5.16 captures decode graphs up to 256 sequences on
# an H100 or H200 at tp < 4 (server_args.py, by GPU memory), so a server allowed 512 running
# requests decoded a full batch without graphs. The launcher covers sglang.max_running_requests
# instead, up to SGLang's largest default; beyond it the user sets the field.
CUDA_GRAPH_BS_COVERED = 512
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
    cfg, index: int, *, port: int, kind: str, pause_mode: str, facts, warnings: list[str] | None = None
) -> list[str]:
    """The command of the run's server `index` (an ExperimentConfig, HostFacts): each server its
    own sampling seed (identical seeds give identical samples inside a GRPO group), disk weight
    loads limited to the run's folders (built-in server), and the flags its pause mode needs
    (pause_mode, already resolved for kind: areal.infra.pause)."""
    from .pause import server_flags_for

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
        extra_flags=server_flags_for(pause_mode, kind),
    )


def cuda_graph_bs(cfg: SGLangConfig) -> int | None:
    """The largest decode batch SGLang captures in a CUDA graph: the configured one, else one that
    covers max_running_requests (at most CUDA_GRAPH_BS_COVERED), else SGLang's own choice (None)."""
    if cfg.cuda_graph_max_bs is not None or cfg.disable_cuda_graph or cfg.max_running_requests is None:
        return cfg.cuda_graph_max_bs
    return min(cfg.max_running_requests, CUDA_GRAPH_BS_COVERED)


def graph_coverage_warnings(cfg: SGLangConfig, graph_bs: int | None) -> list[str]:
    """A warning when running batches can outgrow the captured graphs (they decode without one,
    host-bound)."""
    running = cfg.max_running_requests
    if cfg.disable_cuda_graph or graph_bs is None or running is None or running <= graph_bs:
        return []
    why = "" if cfg.cuda_graph_max_bs is not None else f" (null: the launcher's cap, {CUDA_GRAPH_BS_COVERED})"
    return [
        f"sglang.cuda_graph_max_bs is {graph_bs}{why} and sglang.max_running_requests {running}: SGLang "
        f"decodes batches above {graph_bs} sequences without a CUDA graph; set sglang.cuda_graph_max_bs="
        f"{running} (capture takes longer and holds more memory) or lower sglang.max_running_requests"
    ]


def server_command(
    cfg: SGLangConfig,
    *,
    port: int,
    kind: str,
    python: str,
    sglang_version: str | None = None,
    sglang_flags: frozenset[str] | None = None,
    warnings: list[str] | None = None,
    extra_flags: list[str] | None = None,
) -> list[str]:
    """`python -m <server module> --flag value ...`. SGLang cannot read the project's model names
    (`tiny:<preset>`, `smollm2:135m-instruct`): for those it is started through areal.models.serve,
    which resolves them to the folder every process of the run shares, then execs SGLang. Its decode
    graphs cover the running batch (cuda_graph_bs)."""
    if kind == "sglang":
        graph_bs = cuda_graph_bs(cfg)
        if warnings is not None:
            warnings += graph_coverage_warnings(cfg, graph_bs)
        cfg = cfg.model_copy(update={"cuda_graph_max_bs": graph_bs})
    flags = server_flags(cfg, port=port, kind=kind)
    flags += [f for f in extra_flags or [] if f not in flags]  # --disable-radix-cache: set, or retract's
    if kind != "sglang":
        return [python, "-m", SERVER_MODULES[kind], *flags]
    check_sglang_version(sglang_version)
    note = sglang_version_note(sglang_version)
    if note and warnings is not None:
        warnings.append(note)
    flags = drop_unknown_flags(renamed_flags(flags, sglang_flags), sglang_flags, sglang_version, warnings)
    if any(is_project_model(p) for p in (cfg.model_path, cfg.tokenizer_path) if p):
        return [python, "-m", "areal.models.serve", SERVER_MODULES[kind], *flags]
    return [python, "-m", SERVER_MODULES[kind], *flags]


def sglang_version_note(version: str) -> str | None:
    """A warning when `version` is not one the project was tested with, else None."""
    if version in TESTED_SGLANG:
        return None
    return (
        f"sglang {version} is not a tested version (tested: {', '.join(TESTED_SGLANG)}; the client follows "
        f"their API, and needs at least {MIN_SGLANG}); pip install 'sglang=={TESTED_SGLANG[-1]}' to match"
    )


def check_sglang_version(version: str | None) -> None:
    if version is None:
        raise ConfigError(
            [
                ConfigIssue(
                    "rollout.server",
                    "sglang",
                    "sglang is not installed",
                    f"pip install 'sglang=={TESTED_SGLANG[-1]}' on a GPU machine, "
                    "or set rollout.server=builtin (or auto)",
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


# Flags that SGLang renamed: --cuda-graph-max-bs became --cuda-graph-max-bs-decode. 0.5.9's ServerArgs
# field is the old name; 0.5.16's is the new one (the old is only an argparse alias there, which logs
# a deprecation), and host facts list ServerArgs fields, so the old name alone would be dropped.
RENAMED_FLAGS = {"--cuda-graph-max-bs": "--cuda-graph-max-bs-decode"}


def renamed_flags(flags: list[str], known: frozenset[str] | None) -> list[str]:
    """`flags` with each renamed flag under its new name where the installed SGLang has it."""
    if known is None:
        return flags
    return [RENAMED_FLAGS[f] if f in RENAMED_FLAGS and RENAMED_FLAGS[f] in known else f for f in flags]


def drop_unknown_flags(
    flags: list[str], known: frozenset[str] | None, version: str | None, warnings: list[str] | None
) -> list[str]:
    """Remove flags (with their values) the installed sglang lacks; each drop is a warning. A flag
    keeps every value up to the next flag: list flags (--lora-target-modules q_proj v_proj) have
    several."""
    if known is None:
        return flags
    out, i = [], 0
    while i < len(flags):
        end = i + 1
        while end < len(flags) and not flags[end].startswith("--"):
            end += 1
        if flags[i] in known:
            out += flags[i:end]
        elif warnings is not None:
            warnings.append(f"sglang {version} has no flag {flags[i]}; it is dropped from the server command")
        i = end
    return out


def _version_key(v: str) -> tuple:
    """Order versions like 0.4.9.post2 < 0.4.10 < 0.5.0rc1 < 0.5.0 without extra dependencies."""
    try:
        from packaging.version import Version

        return (Version(v),)
    except Exception:  # packaging missing or odd string: numeric fallback
        return tuple(int(x) for x in re.findall(r"\d+", v))
