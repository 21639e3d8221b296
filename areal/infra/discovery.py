"""Where the inference servers are: config, environment, or the launcher's name record.

Order of precedence (first non-empty wins):
  1. `rollout.server_addrs` in the config (servers someone started by hand);
  2. the environment variable `AREAL_SERVER_ADDRS` (comma-separated host:port);
  3. the name record the launcher writes once every server is healthy:
     `{record_root}/name_resolve/servers.json` = {"addrs": ["host:port", ...]}, where
     record_root is `cluster.name_resolve.record_root` or the run directory
     `{cluster.fileroot}/{experiment_name}/{trial_name}`.

The launcher calls `write_server_addrs`; clients call `discover_server_addrs`. The record is
written atomically (temp file + rename), so a reader never sees half a file.

A second record beside it, `{record_root}/name_resolve/served_weights.json` =
{"path": "...", "version": N}, names the weights the servers should serve: trainer rank 0 writes
it after each disk weight update, the launcher clears it when it starts the servers, and a
server the launcher restarts (launcher.restart_failed_servers) loads that folder instead of the
initial model, so it comes back with the trainer's current weights.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

ENV_VAR = "AREAL_SERVER_ADDRS"
RECORD_SUBPATH = ("name_resolve", "servers.json")
WEIGHTS_SUBPATH = ("name_resolve", "served_weights.json")


def record_path(record_root: str | os.PathLike) -> Path:
    return Path(record_root).joinpath(*RECORD_SUBPATH)


def record_root_of(cfg) -> str:
    """The directory holding name records for an ExperimentConfig."""
    return cfg.cluster.name_resolve.record_root or cfg.run_dir


def write_server_addrs(record_root: str | os.PathLike, addrs: list[str]) -> Path:
    """Publish the servers of a run (the launcher calls this after they are healthy)."""
    path = record_path(record_root)
    _write_atomically(path, {"addrs": normalize_addrs(addrs)})
    return path


def _write_atomically(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def read_server_addrs(record_root: str | os.PathLike) -> list[str]:
    """Addresses in the run's record, or [] when there is no record yet."""
    path = record_path(record_root)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except json.JSONDecodeError as e:
        raise ValueError(
            f'server record {path} is not valid JSON ({e}); expected {{"addrs": ["host:port", ...]}}'
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("addrs"), list):
        raise ValueError(f'server record {path} must be {{"addrs": ["host:port", ...]}}, got {data!r}')
    return normalize_addrs(data["addrs"])


def clear_server_addrs(record_root: str | os.PathLike) -> None:
    """Remove a stale record (the launcher calls this before starting servers)."""
    record_path(record_root).unlink(missing_ok=True)


def write_served_weights(record_root: str | os.PathLike, path: str, version: int) -> Path:
    """Record the Hugging Face folder the servers now serve, as weight version `version`."""
    record = Path(record_root).joinpath(*WEIGHTS_SUBPATH)
    _write_atomically(record, {"path": str(path), "version": int(version)})
    return record


def read_served_weights(record_root: str | os.PathLike) -> tuple[str, int] | None:
    """(folder, version) of the last weight update the trainer recorded; None before the first."""
    record = Path(record_root).joinpath(*WEIGHTS_SUBPATH)
    try:
        data = json.loads(record.read_text())
        return str(data["path"]), int(data["version"])
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(
            f"served-weights record {record} is unreadable ({e}); expected "
            '{"path": "/folder", "version": N}; delete it to restart servers '
            "with the initial model"
        ) from None


def clear_served_weights(record_root: str | os.PathLike) -> None:
    """Forget an earlier run's weights (the launcher calls this before starting servers)."""
    Path(record_root).joinpath(*WEIGHTS_SUBPATH).unlink(missing_ok=True)


def normalize_addrs(addrs) -> list[str]:
    """host:port strings with any http:// prefix and trailing slash removed; checks the form."""
    out = []
    for addr in addrs:
        a = str(addr).strip()
        for prefix in ("http://", "https://"):
            if a.startswith(prefix):
                a = a[len(prefix) :]
        a = a.rstrip("/")
        host, sep, port = a.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"server address {addr!r} is not host:port (e.g. 127.0.0.1:30000)")
        out.append(a)
    return out


def discover_server_addrs(cfg, environ: dict | None = None) -> tuple[list[str], str]:
    """(addresses, where they came from) for an ExperimentConfig; ([], reason) if none found."""
    environ = os.environ if environ is None else environ
    if cfg.rollout.server_addrs:
        return normalize_addrs(cfg.rollout.server_addrs), "rollout.server_addrs"
    env = environ.get(ENV_VAR, "").strip()
    if env:
        return normalize_addrs([a for a in env.split(",") if a.strip()]), f"${ENV_VAR}"
    root = record_root_of(cfg)
    addrs = read_server_addrs(root)
    return addrs, str(record_path(root))
