"""areal/infra/server_process.py: how every server process starts, is waited for and stops.

The servers here are tiny Python programs (no model): one that exits while starting, one that
ignores SIGTERM, and a starter that is SIGKILLed while its server runs."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from areal.infra.health import ServerStartupError, ServerStartupTimeout
from areal.infra.ports import free_port
from areal.infra.server_process import start_server_process, stop_servers, wait_until_serving
from tests.serving import wait_for

PY = sys.executable
IGNORES_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead too
        return f.read().rsplit(")", 1)[1].split()[0] == "Z"


def test_a_server_that_exits_is_reported_with_its_kind_and_log_end(tmp_path):
    code = "import sys; print('loading'); print('bad flag --x', file=sys.stderr); sys.exit(3)"
    addr = f"127.0.0.1:{free_port()}"
    server = start_server_process([PY, "-c", code], addr=addr, log_path=tmp_path / "s.log")
    with pytest.raises(ServerStartupError) as e:
        wait_until_serving([server], 60, timeout_key="test.timeout", kind="inference server")
    message = str(e.value)
    assert message.startswith(f"inference server {addr} exited with code 3 before it was healthy; its log (")
    assert message.endswith("ends with:\nloading\nbad flag --x"), message
    assert e.value.name == addr and e.value.returncode == 3


def test_a_silent_server_names_the_deadline_key(tmp_path):
    server = start_server_process(
        [PY, "-c", "import time; time.sleep(60)"], addr=f"127.0.0.1:{free_port()}", log_path=tmp_path / "s.log"
    )
    try:
        with pytest.raises(ServerStartupTimeout, match=r"within 0.5 s \(raise test.timeout_s if"):
            wait_until_serving([server], 0.5, timeout_key="test.timeout_s", interval=0.05)
    finally:
        assert server.stop(grace_s=5) == -signal.SIGTERM


def test_stop_kills_the_whole_group_after_the_grace(tmp_path):
    stubborn = textwrap.dedent(
        f"""
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c", {IGNORES_TERM!r}])
        print(child.pid, flush=True)
        time.sleep(60)
        """
    )
    server = start_server_process([PY, "-c", stubborn], addr="127.0.0.1:1", log_path=tmp_path / "s.log")
    child = int(wait_for(lambda: server.log().strip(), "the stubborn server's child pid"))
    stop_servers([server], grace_s=0.5)
    assert server.proc.returncode == -signal.SIGKILL
    wait_for(lambda: _gone(child), "the server's child killed with its group", timeout=10)


def test_a_server_dies_with_its_starter(tmp_path):
    """The starter is SIGKILLed (no teardown): its server must not outlive it."""
    starter = textwrap.dedent(
        f"""
        import sys, time
        from areal.infra.server_process import start_server_process
        command = [sys.executable, "-c", "import time; time.sleep(60)"]
        server = start_server_process(command, addr="127.0.0.1:1", log_path={str(tmp_path / "s.log")!r})
        print(server.proc.pid, flush=True)
        time.sleep(60)
        """
    )
    proc = subprocess.Popen([PY, "-c", starter], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(proc.stdout.readline())
        assert not _gone(pid)
        proc.kill()
        proc.wait(10)
        wait_for(lambda: _gone(pid), "the server killed with its starter", timeout=10)
    finally:
        proc.kill()
        proc.stdout.close()
