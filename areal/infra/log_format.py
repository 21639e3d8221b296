"""The one line format areal's processes give Python logging, and its parser.

Trainer workers, the rollout driver and the built-in server call `setup_process_logging()` at
start, so every log record they print reads `<date> <time>,<ms> <logger> <LEVEL> <message>`.
The launcher writes each line to the process's log and reads records back with `parse_record` to
decide which reach its console (launcher/console.py).
"""

from __future__ import annotations

import logging
import re
from typing import TextIO

LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"

_RECORD = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (?P<name>\S+) (?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) "
)


def setup_process_logging(level: int | str = logging.INFO, stream: TextIO | None = None) -> None:
    """Root logging of an areal process: `level` and LOG_FORMAT, to `stream` (stderr by default)."""
    logging.basicConfig(level=level, format=LOG_FORMAT, stream=stream)


def parse_record(line: str) -> tuple[str, str] | None:
    """(logger name, level name) when `line` is a log record in LOG_FORMAT, else None."""
    m = _RECORD.match(line)
    return (m["name"], m["level"]) if m else None
