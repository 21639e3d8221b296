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
"""

from __future__ import annotations

import json
import os
from pathlib import Path

ENV_VAR = "AREAL_SERVER_ADDRS"
RECORD_SUBPATH = ("name_resolve", "servers.json")


def record_path(record_root: str | os.PathLike) -> Path:
    return Path(record_root).joinpath(*RECORD_SUBPATH)


def record_root_of(cfg) -> str:
    """The directory holding name records for an ExperimentConfig."""
    return cfg.cluster.name_resolve.record_root or cfg.run_dir


def write_server_addrs(record_root: str | os.PathLike, addrs: list[str]) -> Path:
    """Publish the servers of a run (the launcher calls this after they are healthy)."""
    addrs = normalize_addrs(addrs)
    path = record_path(record_root)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"addrs": addrs}))
    os.replace(tmp, path)
    return path


def read_server_addrs(record_root: str | os.PathLike) -> list[str]:
    """Addresses in the run's record, or [] when there is no record yet."""
    path = record_path(record_root)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except json.JSONDecodeError as e:
        raise ValueError(f"server record {path} is not valid JSON ({e}); expected "
                         '{"addrs": ["host:port", ...]}') from None
    if not isinstance(data, dict) or not isinstance(data.get("addrs"), list):
        raise ValueError(f'server record {path} must be {{"addrs": ["host:port", ...]}}, got {data!r}')
    return normalize_addrs(data["addrs"])


def clear_server_addrs(record_root: str | os.PathLike) -> None:
    """Remove a stale record (the launcher calls this before starting servers)."""
    record_path(record_root).unlink(missing_ok=True)


def normalize_addrs(addrs) -> list[str]:
    """host:port strings with any http:// prefix and trailing slash removed; checks the form."""
    out = []
    for addr in addrs:
        a = str(addr).strip()
        for prefix in ("http://", "https://"):
            if a.startswith(prefix):
                a = a[len(prefix):]
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
