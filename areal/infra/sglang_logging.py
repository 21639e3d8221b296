"""How an SGLang server the launcher starts logs and stops.

SGLang prints log records as `[<date> <time> TP0] <message>`, with no level, so the launcher could
not tell its errors from its notes. SGLang reads a Python logging dictConfig from the file named by
SGLANG_LOGGING_CONFIG_PATH instead of its own setup (srt/utils/common.py, configure_logger): the
launcher writes `logging_config(level)` there, so SGLang's records read as areal's do
(areal/infra/log_format.py) and the console keeps only what a user must see (launcher/console.py).

SGL_FORCE_SHUTDOWN=1: on SIGTERM, SGLang's HTTP process stops its subprocess watchdog, tells its
schedulers to shut down and exits, without first waiting for requests in flight to drain (the
launcher stops servers when the run is over or has failed: nothing waits for those answers). The
old name on purpose: SGLang 0.5.16 warns that SGL_* variables are deprecated (a line in the
server's log), but its tokenizer manager reads only SGL_FORCE_SHUTDOWN. Measured on one H200
(2026-12-03): SIGTERM to "Force exiting" in 2.4-2.9 s, and no subprocess reported as crashed.
"""

from __future__ import annotations

import json
from pathlib import Path

from .log_format import LOG_FORMAT

LOGGING_FILE = "sglang_logging.json"  # under the run's folder


def logging_config(level: str) -> dict:
    """A logging.config.dictConfig for SGLang: every record at `level` or above (sglang.log_level)
    to stderr, in areal's line format."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"areal": {"format": LOG_FORMAT}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "areal", "stream": "ext://sys.stderr"}},
        "root": {"level": level.upper(), "handlers": ["stderr"]},
    }


def server_env(run_dir: str) -> dict[str, str]:
    """The environment of an SGLang server the launcher starts for the run in `run_dir`."""
    return {"SGLANG_LOGGING_CONFIG_PATH": str(Path(run_dir) / LOGGING_FILE), "SGL_FORCE_SHUTDOWN": "1"}


def write_logging_config(run_dir: str, level: str) -> Path:
    path = Path(run_dir) / LOGGING_FILE
    path.write_text(json.dumps(logging_config(level), indent=1))
    return path
