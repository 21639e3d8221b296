"""Compose an experiment config with Hydra's compose API: YAML groups + CLI overrides -> dict.

Hydra only composes here (no working-directory change, no output folders); validation is the
separate pydantic pass in areal.config. The schema's defaults are stored in Hydra's ConfigStore
as the base node `areal_base` and put first, so every schema key exists and is overridable
without `+`, and Hydra's struct mode rejects a misspelt override at once.

`--config` takes a name under the project's configs/ or a path to a YAML file anywhere; both
see the project's config groups (actor/, rollout/, sglang/, cluster/, experiment/).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from areal.config import ConfigError, ConfigIssue, ExperimentConfig
from areal.config.errors import closest_key

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
_ENTRY = "__areal_entry__"


def find_config(config: str) -> tuple[Path, str]:
    """(directory, config name) for a name under configs/ or a YAML path anywhere."""
    path = Path(config).expanduser()
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path.resolve().parent, path.stem
    name = config[:-5] if config.endswith(".yaml") else config
    if (CONFIG_DIR / f"{name}.yaml").is_file():
        return CONFIG_DIR, name
    known = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
    raise ConfigError([ConfigIssue(
        "--config", config, "no such YAML file, and no config of that name under configs/",
        f"pass a path to a YAML file or one of: {', '.join(known)}")])


def compose(config: str, overrides: list[str] = (), *, resolve: bool = True) -> dict[str, Any]:
    """Merge schema defaults, the config's defaults list, its own values and the overrides.

    resolve=False keeps ${...} interpolations as written (for `--cfg job` without --resolve)."""
    from hydra import compose as hydra_compose
    from hydra import initialize
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    config_dir, name = find_config(config)
    search = [f"file://{CONFIG_DIR}"] + ([f"file://{config_dir}"] if config_dir != CONFIG_DIR else [])
    store = ConfigStore.instance()
    store.store(name="areal_base", node=ExperimentConfig().model_dump())
    store.store(name=_ENTRY, node={"defaults": ["areal_base", name, "_self_"],
                                   "hydra": {"searchpath": search}})
    GlobalHydra.instance().clear()
    try:
        with initialize(version_base=None, config_path=None):
            cfg = hydra_compose(_ENTRY, overrides=list(overrides))
        return OmegaConf.to_container(cfg, resolve=resolve)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError([_issue_from_hydra(e, overrides)]) from None
    finally:
        GlobalHydra.instance().clear()


def schema_keys(model=ExperimentConfig, prefix: str = "") -> list[str]:
    """Every dotted key of the schema (sections and leaves)."""
    keys = []
    for name, field in model.model_fields.items():
        key = prefix + name
        keys.append(key)
        ann = field.annotation
        if isinstance(ann, type) and hasattr(ann, "model_fields"):
            keys += schema_keys(ann, key + ".")
    return keys


def _issue_from_hydra(exc: Exception, overrides) -> ConfigIssue:
    msg = str(exc).strip()
    m = re.search(r"Could not override '([^']+)'", msg) or re.search(r"Key '([^']+)' (?:is not in struct|not in)", msg)
    if m:
        key = m.group(1)
        value = next((o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].lstrip("+~") == key), None)
        guess = closest_key(key, schema_keys())
        fix = f"did you mean {guess}?" if guess else "check the spelling against `areal-launch --cfg job`"
        return ConfigIssue(key, value, "unknown key", fix)
    m = re.search(r"Could not find '([^']+)'", msg)
    if m:
        options = re.findall(r"^\t(\S+)$", msg, flags=re.M)
        fix = f"choose one of: {', '.join(options)}" if options else "check the config group name"
        return ConfigIssue(m.group(1).split("/")[0], m.group(1), "no such config group option", fix)
    first = msg.splitlines()[0] if msg else type(exc).__name__
    return ConfigIssue("overrides", list(overrides), first, "fix the override syntax (key=value, +key=value, ~key)")
