"""Process management and health helpers shared by both backends (real processes, no launcher)."""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
import time
from pathlib import Path

import psutil
import pytest

from areal.infra.health import HealthWatch, ServerStartupError, ServerStartupTimeout, is_healthy, wait_healthy
from areal.infra.server_process import tail_lines
from launcher.procs import (
    ManagedProcess,
    advertised_host,
    child_env,
    cpu_threads_per_process,
    exit_code,
    next_free_port,
    port_is_free,
    stop_all,
    with_flag,
    with_port,
)
from tests.launcher.helpers import wait_gone

PY = sys.executable
# Parent that ignores SIGTERM, with a child that ignores it too and a grandchild in its own
# session (it escapes the process group, so only the tree walk finds it).
STUBBORN = r"""
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
a = subprocess.Popen([sys.executable, "-c", code])
b = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
print("pids", a.pid, b.pid, flush=True)
time.sleep(600)
"""


def _child_pids(proc: ManagedProcess, n: int, timeout: float = 20) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in list(proc.tail):
            if line.startswith("pids"):
                return [int(x) for x in line.split()[1 : 1 + n]]
        time.sleep(0.05)
    raise AssertionError(f"no pids line; output: {list(proc.tail)}")


def test_stop_kills_tree_that_ignores_sigterm(tmp_path):
    proc = ManagedProcess("stubborn", [PY, "-c", STUBBORN], dict(os.environ), log_path=str(tmp_path / "s.log"))
    pids = [proc.pid, *_child_pids(proc, 2)]
    proc.stop(grace_s=1.0)  # all three ignore SIGTERM and would sleep 600 s: gone means killed
    assert wait_gone(pids, timeout=5) == []
    assert "pids" in (tmp_path / "s.log").read_text()


def test_orphans_of_an_exited_leader_are_stopped():
    """The leader exits at once; its child (now an orphan in the group) must still be found."""
    code = (
        "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
        " print('pids', p.pid, flush=True)"
    )
    proc = ManagedProcess("leader", [PY, "-c", code], dict(os.environ))
    orphan = _child_pids(proc, 1)[0]
    proc.popen.wait(10)
    assert psutil.pid_exists(orphan)
    stop_all([proc], grace_s=1.0)
    assert wait_gone([orphan], timeout=5) == []


def test_output_goes_to_log_sink_and_tail(tmp_path):
    seen = []
    proc = ManagedProcess(
        "echo",
        [PY, "-c", "print('a'); print('b'); raise SystemExit(3)"],
        dict(os.environ),
        log_path=str(tmp_path / "e.log"),
        sink=seen.append,
    )
    assert proc.popen.wait(10) == 3
    proc.wait_output()
    assert seen == ["a", "b"] and list(proc.tail) == ["a", "b"]
    assert tail_lines(str(tmp_path / "e.log"), 1) == ["b"]
    assert tail_lines(str(tmp_path / "missing.log")) == []


def test_a_logs_tail_shows_a_progress_bar_as_its_last_state(tmp_path):
    """A real SGLang 0.5.16 log (a cold start): tqdm redraws its bars after carriage returns, so a
    crash report's tail once held 60 'Capturing batches' lines and nothing else; a terminal shows one."""
    fixture = Path(__file__).parent / "fixtures" / "sglang_0.5.16_run_cold_lora.log"
    assert fixture.read_bytes().count(b"Capturing batches") > 30
    tail = tail_lines(str(fixture), 200)
    capture = [line for line in tail if "Capturing batches" in line]
    assert len(capture) == 1 and "100%" in capture[0] and "36/36" in capture[0]
    assert not any("\r" in line for line in tail)
    assert tail[-1] == fixture.read_bytes().decode().rstrip("\n").split("\n")[-1]
    crlf = tmp_path / "crlf.log"
    crlf.write_bytes(b"a\r\n 10%\r 50%\r100%\nb\r\n")
    assert tail_lines(str(crlf)) == ["a", "100%", "b"]


def test_start_failure_names_the_process():
    with pytest.raises(RuntimeError, match="server-3: cannot start"):
        ManagedProcess("server-3", ["/nonexistent/binary"], dict(os.environ))


def test_exit_code_of_signals():
    assert exit_code(3) == 3 and exit_code(-9) == 137 and exit_code(-15) == 143


def test_ports():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        assert not port_is_free(busy)
        moved = next_free_port(busy)
        assert moved > busy and port_is_free(moved)
        assert next_free_port(busy, avoid={moved}) != moved


def test_free_ports_are_below_the_ephemeral_range():
    """Outgoing connections take ports in the kernel's ephemeral range; one found free there can be
    taken before the server binds it (a CI chaos trial's server: "address already in use")."""
    from areal.infra.ports import ephemeral_range, free_port, free_port_block, listen_range

    low, high = ephemeral_range()
    assert 0 < low <= high <= 65535
    start, stop = listen_range()
    assert stop <= low or stop == 65536
    for _ in range(20):
        port = free_port()
        assert start <= port < stop and port_is_free(port)
    base = free_port_block(3)
    assert start <= base and base + 2 < stop and all(port_is_free(base + i) for i in range(3))


def test_command_helpers():
    cmd = ["python", "-m", "areal.server", "--host", "0.0.0.0", "--port", "30000", "--dtype", "float32"]
    assert with_port(cmd, 30005)[6] == "30005" and with_port(cmd, 30005)[-2:] == ["--dtype", "float32"]
    assert with_port(["x"], 1) == ["x", "--port", "1"]
    assert with_flag(cmd, "--dtype", "bfloat16")[-2:] == ["--dtype", "bfloat16"]
    assert with_flag(cmd, "--weight-version", "3")[-2:] == ["--weight-version", "3"]
    assert advertised_host(cmd, "10.0.0.5") == "10.0.0.5"
    assert advertised_host(["x", "--host", "127.0.0.1"], "10.0.0.5") == "127.0.0.1"
    assert advertised_host(["x"]) == "127.0.0.1"


def test_omp_threads_share_cores_unless_user_set():
    assert cpu_threads_per_process(3, cores=8) == 2
    assert cpu_threads_per_process(4, cores=2) == 1
    env = child_env({"A": "1"}, {"B": "2"}, cpu=True, procs_on_node=2, base={})
    assert env["A"] == "1" and env["B"] == "2" and int(env["OMP_NUM_THREADS"]) >= 1
    assert child_env({}, {}, cpu=True, procs_on_node=2, base={"OMP_NUM_THREADS": "7"})["OMP_NUM_THREADS"] == "7"
    assert child_env({"OMP_NUM_THREADS": "5"}, {}, cpu=True, procs_on_node=2, base={})["OMP_NUM_THREADS"] == "5"
    # GPU processes: one OpenMP thread (spinning workers slowed an async trainer by 23%), unless set
    assert child_env({}, {}, cpu=False, procs_on_node=2, base={})["OMP_NUM_THREADS"] == "1"
    assert child_env({}, {}, cpu=False, procs_on_node=2, base={"OMP_NUM_THREADS": "4"})["OMP_NUM_THREADS"] == "4"


def test_wait_healthy_reports_dead_and_slow_servers():
    with pytest.raises(ServerStartupError) as e:
        wait_healthy({"server-0": "127.0.0.1:1"}, 5, lambda name: 7, interval=0.01)
    assert e.value.name == "server-0" and e.value.returncode == 7
    with pytest.raises(ServerStartupError, match="server-1 did not answer .*server_startup_timeout_s"):
        wait_healthy({"server-1": "127.0.0.1:1"}, 0.2, lambda name: None, interval=0.05)
    assert not is_healthy("127.0.0.1:1")
    wait_healthy({"server-2": "x:1"}, 1, lambda name: None, check=lambda n, a: True)


def test_wait_healthy_timeout_names_every_silent_server_and_the_key():
    servers = {"a": "127.0.0.1:1", "b": "127.0.0.1:2", "up": "x:1"}
    with pytest.raises(ServerStartupTimeout) as e:  # also a TimeoutError, as callers expect
        wait_healthy(servers, 0.1, None, 0.02, check=lambda n, _a: n == "up", timeout_key="rollout.setup_timeout_s")
    assert isinstance(e.value, TimeoutError) and e.value.name == "a" and e.value.returncode is None
    assert str(e.value) == (
        "a did not answer http://127.0.0.1:1/health within 0.1 s; b did not answer either "
        "(raise rollout.setup_timeout_s if the model is slow to load)"
    )


def test_health_watch_names_the_server_that_stops_answering(monkeypatch):
    import threading
    import types

    # the watch's own clock: silence is measured on it, so a busy machine that delays the probing
    # thread cannot make the answering server look silent too
    clock = [0.0]
    monkeypatch.setattr(
        sys.modules[HealthWatch.__module__], "time", types.SimpleNamespace(monotonic=lambda: clock[0], sleep=time.sleep)
    )
    answering = {"server-0": True, "server-1": True}
    rounds, probed = [0], threading.Condition()

    def probe(name, addr):
        if name == "server-1":  # probed last: server-0's answer of this round is recorded
            with probed:
                rounds[0] += 1
                probed.notify_all()
        return answering[name]

    def two_more_rounds():  # the second began after this call
        with probed:
            target = rounds[0] + 2
            assert probed.wait_for(lambda: rounds[0] >= target, 60), "the watch stopped probing"

    watch = HealthWatch({"server-0": "a:1", "server-1": "b:1"}, timeout_s=0.3, probe=probe, interval_s=0.05)
    try:
        assert watch.silent() is None
        answering["server-1"] = False
        two_more_rounds()
        clock[0] += 1.0  # past the timeout, then server-0 answers again and server-1 does not
        two_more_rounds()
        name, seconds = watch.silent()
        assert name == "server-1" and seconds > 0.3
        watch.reset("server-1")
        assert watch.silent() is None
    finally:
        watch.close()


def test_health_watch_does_not_blame_servers_for_its_own_pause(monkeypatch):
    """The launcher frozen (SIGSTOP, a suspended machine) past the timeout: no probe failed, so no
    server is silent, however old its last answer."""
    import threading
    import types

    clock = [0.0]
    monkeypatch.setattr(
        sys.modules[HealthWatch.__module__], "time", types.SimpleNamespace(monotonic=lambda: clock[0], sleep=time.sleep)
    )
    probed = threading.Event()

    def probe(name, addr):
        probed.set()
        return True

    watch = HealthWatch({"server-0": "a:1"}, timeout_s=0.3, probe=probe, interval_s=0.05)
    try:
        assert probed.wait(60), "the watch never probed"
        clock[0] += 10.0  # no probe ran meanwhile; the next one (if any before the check) answers
        assert watch.silent() is None
    finally:
        watch.close()


def test_a_stopped_process_gets_sigterm_not_sigkill():
    """kill_trees sends SIGCONT after SIGTERM: a SIGSTOPped server can shut down cleanly."""
    code = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); "
        "print('up', flush=True); time.sleep(600)"
    )
    proc = ManagedProcess("stopped", [PY, "-c", code], dict(os.environ))
    deadline = time.monotonic() + 20
    while "up" not in proc.tail:  # its SIGTERM handler is installed
        assert time.monotonic() < deadline, list(proc.tail)
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGSTOP)
    stop_all([proc], grace_s=30)
    assert proc.poll() == 0  # its SIGTERM handler ran; no SIGKILL was needed


# A leader that stops its own child on SIGTERM (as SGLang's HTTP process stops its schedulers),
# then says how the child ended and exits.
SELF_STOPPING = r"""
import signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
def stop(*_):
    child.stdin.close()  # the child's own way to end
    print("child exit", child.wait(timeout=10), flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("up", child.pid, flush=True)
time.sleep(600)
"""


def test_leader_stops_its_own_children_before_they_are_signalled(tmp_path):
    """kill_trees signals the leader first: a child it shuts down itself ends normally (exit 0),
    not by the launcher's SIGTERM (-15), which SGLang reports as a subprocess crash. Lines printed
    while the launcher stops a process reach its log, not its sink (the console)."""
    seen: list[str] = []
    proc = ManagedProcess(
        "server-0", [PY, "-c", SELF_STOPPING], dict(os.environ), log_path=str(tmp_path / "s.log"), sink=seen.append
    )
    deadline = time.monotonic() + 20
    while not any(line.startswith("up") for line in proc.tail):
        assert time.monotonic() < deadline, list(proc.tail)
        time.sleep(0.05)
    child = int(next(line for line in proc.tail if line.startswith("up")).split()[1])
    stop_all([proc], grace_s=30)
    assert proc.poll() == 0 and wait_gone([child], timeout=5) == []
    assert "child exit 0" in (tmp_path / "s.log").read_text()
    assert [line for line in seen if line.startswith("child exit")] == []  # muted while stopping


def test_a_stalled_server_is_named_once_and_again_when_it_answers(monkeypatch, capsys):
    """The launcher's note_stalls, on a real HealthWatch: one line when a server has been silent
    for STALL_NOTICE_S (SGLang's "Health check failed" every 7 s stays in its log), one when it
    answers again; none while it answers."""
    import threading
    import types

    from launcher.supervisor import STALL_NOTICE_S, Supervisor, health_limit

    clock = [0.0]
    monkeypatch.setattr(
        sys.modules[HealthWatch.__module__], "time", types.SimpleNamespace(monotonic=lambda: clock[0], sleep=time.sleep)
    )
    answering, rounds, probed = [True], [0], threading.Condition()

    def probe(name, addr):
        with probed:
            rounds[0] += 1
            probed.notify_all()
        return answering[0]

    def two_more_rounds():
        with probed:
            target = rounds[0] + 2
            assert probed.wait_for(lambda: rounds[0] >= target, 60), "the watch stopped probing"

    restarts = types.SimpleNamespace(restart_failed_servers=False)
    run = types.SimpleNamespace(
        stalled={},
        cfg=types.SimpleNamespace(launcher=restarts),
        plan=types.SimpleNamespace(server_kind="sglang"),
        procs={"server-0": types.SimpleNamespace(log_path="/run/logs/server-0.log")},
        held=set(),
        compiler_seen=lambda name: None,  # no compiler in its tree (test_local_run has one)
        outcome=lambda: Supervisor.outcome(run),
    )
    watch = HealthWatch({"server-0": "a:1"}, timeout_s=300, probe=probe, interval_s=0.05)
    try:
        two_more_rounds()
        Supervisor.note_stalls(run, watch, health_limit(watch))
        assert capsys.readouterr().out == ""
        answering[0] = False
        two_more_rounds()
        clock[0] += STALL_NOTICE_S + 1
        Supervisor.note_stalls(run, watch, health_limit(watch))
        Supervisor.note_stalls(run, watch, health_limit(watch))  # said once
        out = capsys.readouterr().out.splitlines()
        assert len(out) == 1 and out[0].startswith(
            "[launcher] server-0 has not answered /health for 31 s: its scheduler"
        )
        assert "the run fails if it stays silent for launcher.server_health_timeout_s=300" in out[0]
        assert out[0].endswith("(log: /run/logs/server-0.log)")
        answering[0] = True
        two_more_rounds()
        Supervisor.note_stalls(run, watch, health_limit(watch))
        assert re.fullmatch(r"\[launcher\] server-0 answers /health again, after \d+ s\n", capsys.readouterr().out)
        restarts.restart_failed_servers = True  # a second silence, where the server would be restarted
        answering[0] = False
        two_more_rounds()
        clock[0] += STALL_NOTICE_S + 1
        Supervisor.note_stalls(run, watch, health_limit(watch))
        out = capsys.readouterr().out
        assert "it is restarted (launcher.restart_failed_servers) if it stays silent for" in out, out
    finally:
        watch.close()


def test_a_stopped_subprocess_counts_as_a_stopped_process():
    """launcher.stopped_timeout_s watches whole trees: SGLang's HTTP process answers while its
    SIGSTOPped scheduler generates nothing. The stopped descendant is named by pid and name."""
    from launcher.supervisor import is_stopped, stopped_in_tree

    code = (
        "import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
        " print('pids', c.pid, flush=True); time.sleep(600)"
    )
    proc = ManagedProcess("server-0", [PY, "-c", code], dict(os.environ))
    try:
        child = _child_pids(proc, 1)[0]
        assert not is_stopped(proc.pid)
        os.kill(child, signal.SIGSTOP)
        deadline = time.monotonic() + 20
        while psutil.Process(child).status() != psutil.STATUS_STOPPED:  # the kernel applies it promptly
            assert time.monotonic() < deadline, "the child never entered the stopped state"
            time.sleep(0.01)
        assert is_stopped(proc.pid)
        assert stopped_in_tree(proc.pid) == f"pid {child} ({psutil.Process(child).name()})"
        os.kill(proc.pid, signal.SIGSTOP)
        while psutil.Process(proc.pid).status() != psutil.STATUS_STOPPED:
            assert time.monotonic() < deadline, "the leader never entered the stopped state"
            time.sleep(0.01)
        assert stopped_in_tree(proc.pid) == ""  # the leader itself
        for pid in (proc.pid, child):
            os.kill(pid, signal.SIGCONT)
        while stopped_in_tree(proc.pid) is not None:
            assert time.monotonic() < deadline, "the tree stayed stopped after SIGCONT"
            time.sleep(0.01)
    finally:
        stop_all([proc], grace_s=5)
