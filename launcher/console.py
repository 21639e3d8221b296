"""What of a child process's output reaches the launcher's console.

Every line a process prints goes to its log, `{run_dir}/logs/<role>-<index>.log`. The console is
the run's live view, so it shows a line unless it is an INFO or DEBUG log record of a logger
outside the run's own (`CONSOLE_INFO_LOGGERS`). It keeps:

- lines that are not log records: the trainer's progress line, print output, tracebacks, the
  server's ready line, and the lines of programs that log in another format (SGLang);
- log records at WARNING or above, from any logger;
- INFO records of the trainer and the rollout driver (`areal.trainer`, `areal.driver`), which log
  rare events: where rollouts come from, recovery from a checkpoint, a checkpoint saved.

What stays in the log only is the engines', servers' and libraries' INFO and DEBUG records: per-step
details such as a weight update's time and size, the server's scheduler statistics or memory
released and resumed (metrics.jsonl has the per-step figures too). The launcher's own lines
(`[launcher] ...`) are printed directly and always reach the console.

A log record is a line in the format areal's processes give Python logging
(`areal/infra/log_format.py`: `<date> <time>,<ms> <logger> <LEVEL> <message>`).

Torch-free.
"""

from __future__ import annotations

from typing import Callable

from areal.infra.log_format import parse_record

from .procs import console_sink

# Loggers whose INFO records reach the console (a name and its children: areal.trainer.x too).
CONSOLE_INFO_LOGGERS = ("areal.trainer", "areal.driver")


def shows_on_console(line: str) -> bool:
    """Whether a child's output line is echoed to the console (module docstring: the rule)."""
    record = parse_record(line)
    if record is None:
        return True
    name, level = record
    if level not in ("DEBUG", "INFO"):
        return True
    return any(name == root or name.startswith(root + ".") for root in CONSOLE_INFO_LOGGERS)


def process_console(prefix: str) -> Callable[[str], None]:
    """The console sink of one process: `[prefix] line` for the lines `shows_on_console` keeps."""
    sink = console_sink(prefix)

    def filtered(line: str) -> None:
        if shows_on_console(line):
            sink(line)

    return filtered
