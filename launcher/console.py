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

An SGLang server logs in that format too (the launcher hands it a logging config:
areal/infra/sglang_logging.py), but most of what it prints is about itself: warnings about its own
deprecations, imports and limits, Python warnings, CUDA-graph capture bars. Its console keeps only
records at ERROR or above and tracebacks (`SGLangConsole`); the log keeps everything, and a server
that exits is reported by the launcher with its log's path and last lines. Nothing of a process
reaches the console once the launcher has begun to stop it (launcher/procs.py, `mute`).

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


# SGLang's errors about its own /health probes: the launcher probes /health, and names a server
# that stops answering itself (launcher/supervisor.py, note_stalls), once instead of every 7 s.
SGLANG_QUIET_ERRORS = ("Health check failed",)


class SGLangConsole:
    """Which lines of an SGLang server reach the console: records at ERROR or above but for
    SGLANG_QUIET_ERRORS, and Python tracebacks (from `Traceback (most recent call last):` to the
    exception line), nothing else."""

    def __init__(self):
        self._in_traceback = False

    def shows(self, line: str) -> bool:
        record = parse_record(line)
        if record is not None:
            self._in_traceback = False
            message = line.split(f" {record[0]} {record[1]} ", 1)[-1]
            return record[1] in ("ERROR", "CRITICAL") and not message.startswith(SGLANG_QUIET_ERRORS)
        if line.startswith("Traceback (most recent call last)"):
            self._in_traceback = True
            return True
        if not self._in_traceback:
            return False
        if line[:1] not in (" ", "\t", "") and not line.startswith(_CHAINED):
            self._in_traceback = False  # the exception line ends the traceback
        return True


_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")


def console_program(plan, spec) -> str | None:
    """The program whose console rules a planned process follows: its server kind for a server."""
    return plan.server_kind if spec.role == "server" else None


def process_console(prefix: str, program: str | None = None) -> Callable[[str], None]:
    """The console sink of one process: `[prefix] line` for the lines it keeps (`shows_on_console`;
    for an SGLang server, program="sglang", `SGLangConsole`)."""
    sink = console_sink(prefix)
    shows = SGLangConsole().shows if program == "sglang" else shows_on_console

    def filtered(line: str) -> None:
        if shows(line):
            sink(line)

    return filtered
