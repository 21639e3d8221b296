"""Which lines of a child process reach the launcher's console (launcher/console.py)."""

import logging

import pytest

from areal.infra.log_format import LOG_FORMAT, parse_record
from launcher.console import process_console, shows_on_console


def record(name: str, level: int, msg: str) -> str:
    """A line exactly as an areal process prints it (LOG_FORMAT)."""
    return logging.Formatter(LOG_FORMAT).format(logging.LogRecord(name, level, __file__, 1, msg, None, None))


def test_parse_record_reads_the_processes_format():
    assert parse_record(record("areal.fsdp", logging.INFO, "weight update v3 (disk): 0.05 s")) == ("areal.fsdp", "INFO")
    assert parse_record(record("areal.server", logging.WARNING, "x")) == ("areal.server", "WARNING")
    assert parse_record("step 3/250 | reward 0.512 | loss -0.1") is None
    assert parse_record("Traceback (most recent call last):") is None


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        (record("areal.fsdp", logging.INFO, "weight update v3 (disk): 0.05 s, 1.9 MB"), False),
        (record("areal.server.scheduler", logging.INFO, "last 10s: 512 decode steps"), False),
        (record("areal.server", logging.DEBUG, "request abc"), False),
        (record("httpx", logging.INFO, "HTTP Request: POST /generate"), False),
        (record("areal.fsdp", logging.WARNING, "weight update slow"), True),
        (record("areal.server", logging.ERROR, "generation failed"), True),
        (record("areal.trainer", logging.INFO, "recovered from checkpoints/step_00000004"), True),
        (record("areal.trainer.context", logging.INFO, "step 4: checkpoint saved"), True),
        (record("areal.driver", logging.INFO, "saved 4 batches"), True),
        (record("areal.trainerx", logging.INFO, "not the trainer's logger"), False),
        ("step 12/250 | reward 0.532 | acc 0.610 | 256.0 samples/s | ETA 5m10s", True),
        ("[rank0]: RuntimeError: 1 of 1 inference servers failed", True),
        ("The server is fired up and ready to roll!", True),
        ("[2026-01-01 10:00:00 TP0] Decode batch. #running-req: 8", True),  # SGLang's own format
    ],
)
def test_console_keeps_progress_events_and_warnings_not_engine_details(line, shown):
    assert shows_on_console(line) is shown


def test_process_console_prefixes_what_it_keeps(capsys):
    sink = process_console("trainer-0")
    sink(record("areal.fsdp", logging.INFO, "weight update v1 (disk): 0.05 s, 1.9 MB"))
    sink("step 1/2 | reward 0.100")
    assert capsys.readouterr().out == "[trainer-0] step 1/2 | reward 0.100\n"
