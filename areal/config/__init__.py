"""The experiment config schema (pydantic, torch-free) and its validation.

from areal.config import ExperimentConfig, validate_config, ConfigError

The engines' from_pretrained build their configs from keywords in pretrained_actor.py
(FSDPEngine) and pretrained_client.py (RemoteSGLangEngine).
"""

from .errors import ConfigError, ConfigIssue
from .experiment import ExperimentConfig
from .validate import validate_config, validate_schema

__all__ = ["ConfigError", "ConfigIssue", "ExperimentConfig", "validate_config", "validate_schema"]
