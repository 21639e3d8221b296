"""Compose an experiment config with Hydra's compose API: YAML groups + CLI overrides -> dict.

Hydra only composes here (no working-directory change, no output folders); validation is the
separate pydantic pass in areal.config. The schema's defaults are stored in Hydra's ConfigStore
as the base node `areal_base` and put first, so every schema key exists and is overridable
without `+`, and Hydra's struct mode rejects a misspelt override at once.

`--config` takes a name under the project's configs/ or a path to a YAML file anywhere; both
see the project's config groups (actor/, rollout/, sglang/, cluster/, algo/, experiment/).
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
    raise ConfigError(
        [
            ConfigIssue(
                "--config",
                config,
                "no such YAML file, and no config of that name under configs/",
                f"pass a path to a YAML file or one of: {', '.join(known)}",
            )
        ]
    )


def compose(config: str, overrides: list[str] = (), *, resolve: bool = True) -> dict[str, Any]:
    """Merge schema defaults, the config's defaults list, its own values and the overrides.

    resolve=False keeps ${...} interpolations as written (for `--cfg job` without --resolve)."""
    import yaml
    from hydra import compose as hydra_compose
    from hydra import initialize
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    config_dir, name = find_config(config)
    base = ExperimentConfig().model_dump()
    _check_top_level(config_dir / f"{name}.yaml", config, base)
    search = [f"file://{CONFIG_DIR}"] + ([f"file://{config_dir}"] if config_dir != CONFIG_DIR else [])
    store = ConfigStore.instance()
    store.store(name="areal_base", node=base)
    store.store(name=_ENTRY, node={"defaults": ["areal_base", name, "_self_"], "hydra": {"searchpath": search}})
    GlobalHydra.instance().clear()
    try:
        with initialize(version_base=None, config_path=None):
            cfg = hydra_compose(_ENTRY, overrides=list(overrides))
        return OmegaConf.to_container(cfg, resolve=resolve)
    except (HydraException, OmegaConfBaseException, yaml.YAMLError, ValueError) as e:
        # ValueError: Hydra raises it bare for some malformed overrides (e.g. `=5`)
        raise ConfigError([_issue_from_hydra(e, overrides, config)]) from None
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


def _check_top_level(path: Path, config: str, base: dict) -> None:
    """The experiment file must be YAML whose top level is a mapping (or empty), shaped like `base`."""
    import yaml

    if not path.is_file():
        return
    try:
        with path.open() as f:
            data = yaml.safe_load(f)
    except yaml.YAMLError as e:
        raise ConfigError([_yaml_issue(e, config)]) from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(
            [
                ConfigIssue(
                    "--config",
                    config,
                    f"the top level of {path} is a {type(data).__name__}, not a mapping",
                    "write the experiment as `key: value` lines (e.g. `actor:` with its keys indented below)",
                )
            ]
        )
    issues = _shape_issues(data or {}, base)
    if issues:
        raise ConfigError(issues)


def _shape_issues(data: dict, base: dict, prefix: str = "") -> list[ConfigIssue]:
    """A list where the schema has a mapping, or the reverse: Hydra cannot merge those and its
    error loses the key, so they are found here (other type errors are left to validation)."""
    issues = []
    for name, value in data.items():
        if name not in base:
            continue  # unknown keys are reported by validation, with a suggestion
        key, want = f"{prefix}{name}", base[name]
        if isinstance(want, dict) and isinstance(value, dict):
            issues += _shape_issues(value, want, key + ".")
        elif isinstance(want, (dict, list)) and isinstance(value, (dict, list)) and type(want) is not type(value):
            kind = "a mapping" if isinstance(want, dict) else "a list"
            issues.append(
                ConfigIssue(key, value, f"a {type(value).__name__} where {kind} belongs", f"write {key} as {kind}")
            )
    return issues


def _yaml_issue(exc: Exception, config: str) -> ConfigIssue:
    mark = getattr(exc, "problem_mark", None)
    where = f" ({mark.name}, line {mark.line + 1}, column {mark.column + 1})" if mark else ""
    what = getattr(exc, "problem", None) or " ".join(str(exc).split())
    return ConfigIssue(
        "--config",
        config,
        f"not valid YAML: {what}{where}",
        "fix the YAML at the line shown (indent with spaces, close brackets, no duplicate keys)",
    )


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~").strip()


def _group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def _issue_from_hydra(exc: Exception, overrides, config: str = "") -> ConfigIssue:
    import yaml
    from hydra.errors import OverrideParseException

    msg = str(exc).strip()
    if isinstance(exc, yaml.YAMLError):
        return _yaml_issue(exc, config)
    if isinstance(exc, OverrideParseException):
        first = exc.message.strip().splitlines()[0]
        return ConfigIssue(
            _override_key(exc.override) or "overrides",
            exc.override,
            f"cannot parse the override: {first}",
            "fix the override syntax (key=value, +key=value, ~key, key=[a,b], key={k: v})",
        )
    m = re.search(r"Could not override '([^']+)'\. No match in the defaults list", msg)
    if m:
        group = m.group(1)
        value = next((o.split("=", 1)[1] for o in overrides if _override_key(o) == group and "=" in o), None)
        options = _group_options(group)
        if value in options:
            return ConfigIssue(
                group, value, "this config's defaults list has no entry for the group", f"add it with +{group}={value}"
            )
        return ConfigIssue(
            group,
            value,
            "no such config group option",
            f"choose one of: {', '.join(options)} (with +{group}=... when the config's defaults list lacks the group)",
        )
    cause_key = getattr(exc.__cause__, "full_key", None)
    m = (
        re.search(r"Could not override '([^']+)'", msg)
        or re.search(r"Key '([^']+)' (?:is not in struct|not in)", msg)
        or re.search(r"Could not delete from config\. '([^']+)' does not exist", msg)
    )
    if m:
        key = m.group(1)
        value = next((o.split("=", 1)[1] for o in overrides if _override_key(o) == key and "=" in o), None)
        if cause_key and cause_key.startswith(key + "."):
            key = cause_key  # a dict value with an unknown key inside: name that key
        guess = closest_key(key, [k for k in schema_keys() if k.count(".") == key.count(".")])
        fix = f"did you mean {guess}?" if guess else "check the spelling against `areal-launch --cfg job`"
        return ConfigIssue(key, value, "unknown key", fix)
    m = re.search(r"Could not find '([^']+)'", msg)
    if m:
        options = re.findall(r"^\t(\S+)$", msg, flags=re.M)
        fix = f"choose one of: {', '.join(options)}" if options else "check the config group name"
        return ConfigIssue(m.group(1).split("/")[0], m.group(1), "no such config group option", fix)
    first = msg.splitlines()[0] if msg else type(exc).__name__
    m = re.match(r"In '([^']+)': .*? raised while composing config:\n(.*)", msg)
    if m:  # a config file that cannot be merged (the key is lost in Hydra's message)
        return ConfigIssue("--config", m.group(1), m.group(2), "fix that config file")
    full_key = getattr(exc, "full_key", None)
    if full_key:  # e.g. an interpolation naming a key that does not exist
        return ConfigIssue(full_key, None, first, "make every ${...} name an existing key (e.g. ${actor.dtype})")
    return ConfigIssue("overrides", list(overrides), first, "fix the override syntax (key=value, +key=value, ~key)")
