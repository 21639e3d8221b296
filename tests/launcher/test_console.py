"""Which lines of a child process reach the launcher's console (launcher/console.py)."""

import logging
from pathlib import Path

import pytest

from areal.infra.log_format import LOG_FORMAT, parse_record
from launcher.console import process_console, shows_on_console


def record(name: str, level: int, msg: str) -> str:
    """A line exactly as an areal process prints it (LOG_FORMAT), at a fixed time: the lines name
    parametrized tests, whose ids every pytest-xdist worker must collect alike."""
    rec = logging.LogRecord(name, level, __file__, 1, msg, None, None)
    rec.created, rec.msecs = 1_767_225_600.0, 432.0
    return logging.Formatter(LOG_FORMAT).format(rec)


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


def sglang_record(level: int, msg: str, name: str = "sglang.srt.managers.scheduler") -> str:
    """A line as SGLang prints a record under the launcher's logging config (sglang_logging.py)."""
    return record(name, level, msg)


def test_sglang_console_keeps_errors_and_tracebacks_only():
    from launcher.console import SGLangConsole

    console = SGLangConsole()
    lines = [
        (sglang_record(logging.WARNING, "Fail to set RLIMIT_NOFILE: current limit exceeds maximum limit"), False),
        (sglang_record(logging.INFO, "Capture cuda graph end. Time elapsed: 6.12 s. mem usage=0.41 GB."), False),
        (
            "/usr/lib/python3.12/site-packages/fastapi/routing.py:200: FutureWarning: ORJSONResponse is deprecated",
            False,
        ),
        ("  warnings.warn(", False),
        ("Capturing batches (bs=256 avail_mem=40.1 GB): 100%|##########| 36/36 [00:05<00:00,  6.6it/s]", False),
        ("[2026-12-03 07:02:01 TP0] Load weight end. type=LlamaForCausalLM", False),  # SGLang's own format
        (sglang_record(logging.ERROR, "Subprocess scheduler_0 (pid=4242) crashed with exit code -9."), True),
        ("Traceback (most recent call last):", True),
        ('  File "/sglang/srt/managers/scheduler.py", line 3000, in run_scheduler_process', True),
        ("    scheduler.event_loop_overlap()", True),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", True),
        ("[2026-12-03 07:02:02 TP0] Scheduler hit an exception", False),
        (sglang_record(logging.CRITICAL, "scheduler died"), True),
    ]
    assert [console.shows(line) for line, _ in lines] == [shown for _, shown in lines]


def test_sglang_console_follows_chained_tracebacks():
    from launcher.console import SGLangConsole

    console = SGLangConsole()
    chained = [
        "Traceback (most recent call last):",
        '  File "a.py", line 1, in f',
        "KeyError: 'x'",
    ]
    assert all(console.shows(line) for line in chained)
    assert console.shows("Capturing batches: 10%") is False  # the block ended at the exception line
    console = SGLangConsole()
    block = [
        "Traceback (most recent call last):",
        "KeyError: 'x'",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        "RuntimeError: scheduler failed",
    ]
    assert [console.shows(line) for line in block] == [True, True, False, False, False, True, True]


def test_sglang_logging_config_gives_records_the_console_can_read(tmp_path):
    """The file the launcher writes for SGLANG_LOGGING_CONFIG_PATH: a dictConfig whose records
    parse as areal's (level and logger name), at sglang.log_level."""
    import io
    import logging.config

    from areal.infra.sglang_logging import logging_config

    config = logging_config("warning")
    stream = io.StringIO()
    config["handlers"]["stderr"]["stream"] = stream
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        logging.config.dictConfig(config)
        logging.getLogger("sglang.srt.entrypoints.http_server").warning("Fail to set RLIMIT_NOFILE")
        logging.getLogger("sglang.srt.entrypoints.http_server").info("not at warning level")
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and parse_record(lines[0]) == ("sglang.srt.entrypoints.http_server", "WARNING")


FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("name", ["sglang_0.5.16_run_warm.log", "sglang_0.5.16_run_cold_lora.log"])
def test_sglang_console_on_real_server_logs(name):
    """Whole server logs of two successful one-GPU runs on SGLang 0.5.16 (one H200, 2026-12-03,
    the launcher's logging config in effect): a 5-step run on warm caches, and a 40-step LoRA run
    that started cold beside two others (16 "Health check failed" errors while Triton compiled).
    While the run goes on, none of SGLang's lines reach the console; after the launcher's SIGTERM,
    only SGLang's "Force exiting" error would, and the launcher mutes a process it stops."""
    from launcher.console import SGLangConsole

    lines = (FIXTURES / name).read_text().splitlines()
    assert sum(parse_record(line) is not None for line in lines) >= 5  # SGLang logged in areal's format
    stop = next(i for i, line in enumerate(lines) if "SIGTERM received" in line)
    console = SGLangConsole()
    shown = [line for line in lines if console.shows(line)]
    assert [lines.index(line) > stop for line in shown] == [True]
    assert shown[0].endswith("ERROR Signal SIGTERM received while force shutdown flag set. Force exiting.")
