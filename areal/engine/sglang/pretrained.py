"""The config behind RemoteSGLangEngine.from_pretrained: the keyword builder of areal.config
(`pretrained_client_config`), checked against this machine when the engine will start its own
servers, so an impossible layout fails at construction rather than in a server log."""

from __future__ import annotations

from areal.config import ConfigError, ConfigIssue, ExperimentConfig
from areal.config.pretrained_client import pretrained_client_config


def pretrained_config(model: str, **keywords) -> ExperimentConfig:
    """The validated ExperimentConfig for RemoteSGLangEngine.from_pretrained (see its docstring);
    `keywords` are pretrained_client_config's."""
    cfg = pretrained_client_config(model, **keywords)
    if not cfg.rollout.server_addrs:
        _check_local_servers_possible(cfg)
    return cfg


def _check_local_servers_possible(cfg: ExperimentConfig) -> None:
    """Fail at construction, not in a server log, when the local server program cannot do tp."""
    from areal.config.parallel import parse_parallel
    from areal.engine.sglang.local_servers import server_kind

    tp = parse_parallel(cfg.rollout.backend, allowed_backends=("sglang",)).tp
    if tp > 1 and server_kind(cfg) == "builtin":
        raise ConfigError(
            [
                ConfigIssue(
                    "rollout.backend",
                    cfg.rollout.backend,
                    f"tp_size={tp} needs SGLang, but servers would be the built-in one (one device each)",
                    "pass tp_size=1, or run on a CUDA machine with sglang installed (rollout.server=sglang)",
                )
            ]
        )
