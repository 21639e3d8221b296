"""The experiment config schema (pydantic, torch-free) and its validation.

from areal.config import ExperimentConfig, validate_config, ConfigError
"""

from .errors import ConfigError, ConfigIssue
from .experiment import ExperimentConfig
from .validate import validate_config

__all__ = ["ConfigError", "ConfigIssue", "ExperimentConfig", "validate_config"]
