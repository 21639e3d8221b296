"""The local backend on real processes: stand-in servers and fake trainers, plans built directly."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

import yaml

from launcher.cli import write_run_dir
from launcher.local import run_local
from launcher.supervisor import cause_first
from tests.launcher.helpers import (
    all_pids,
    check_compiling_server_run,
    compiling_server_run,
    free_ports,
    make_cfg,
    make_plan,
    outputs,
    wait_gone,
)


def run(tmp_path, *overrides):
    """Run a CPU plan (1 stand-in server, 2 fake trainers unless overridden); (rc, cfg)."""
    ports = [f"launcher.server_base_port={free_ports(2)}", f"launcher.trainer_master_port={free_ports(1)}"]
    cfg = make_cfg(tmp_path, *ports, *overrides)
    plan = make_plan(cfg)
    write_run_dir(cfg, plan)
    return run_local(plan, cfg), cfg


def ran_out(cfg, rank: int) -> bool:
    """Whether fake trainer `rank` finished its FAKE_SLEEP_S rather than being stopped."""
    return f"trainer {rank} done" in (Path(cfg.run_dir) / "logs" / f"trainer-{rank}.log").read_text()


def test_trainers_get_servers_and_distributed_env(tmp_path, capsys):
    rc, cfg = run(tmp_path)
    assert rc == 0
    out = outputs(cfg.run_dir)
    addr = f"127.0.0.1:{cfg.launcher.server_base_port}"
    for rank in (0, 1):
        info = out[f"trainer-{rank}"]
        env = info["env"]
        assert env["AREAL_SERVER_ADDRS"] == addr and info["healthy"] == {addr: True}
        assert info["record"] == {"addrs": [addr]}  # published once the server answered
        assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == (str(rank), "2", str(rank))
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == str(cfg.launcher.trainer_master_port)
        assert env["CUDA_VISIBLE_DEVICES"] == ""
        assert env["OMP_NUM_THREADS"] == str(max(1, len(os.sched_getaffinity(0)) // 3))
        assert info["config_exists"]
    logs = Path(cfg.run_dir) / "logs"
    assert sorted(p.name for p in logs.iterdir()) == ["server-0.log", "trainer-0.log", "trainer-1.log"]
    assert "trainer 1 done" in (logs / "trainer-1.log").read_text()
    console = capsys.readouterr().out
    assert "[trainer-0] trainer 0 done" in console and "[server-0] fake server ready" in console
    # the console keeps progress, run events and warnings; per-step engine records stay in the log
    assert "[trainer-0] step 1/1 | reward 0.500" in console
    assert "areal.trainer INFO step 1: checkpoint saved" in console and "a warning the console shows" in console
    assert "weight update v1" not in console and "weight update v1" in (logs / "trainer-0.log").read_text()
    assert wait_gone(all_pids(cfg.run_dir)) == []  # the server was stopped after the trainers


def test_failure_stops_every_process_tree(tmp_path, capsys):
    """Rank 1 fails; rank 0 ignores SIGTERM and has a grandchild; the server has one too."""
    rc, cfg = run(
        tmp_path,
        '+launcher.trainer_env.FAKE_FAIL_RANK="1"',
        '+launcher.trainer_env.FAKE_EXIT="3"',
        '+launcher.trainer_env.FAKE_FAIL_AFTER_S="1"',
        '+launcher.trainer_env.FAKE_SLEEP_S="300"',
        '+launcher.trainer_env.FAKE_SPAWN_CHILD="1"',
        '+launcher.trainer_env.FAKE_IGNORE_TERM="1"',
        '+launcher.server_env.FAKE_SERVER_SPAWN_CHILD="1"',
    )
    assert rc == 3
    assert not ran_out(cfg, 0)  # stopped (SIGKILL after the grace), not waited out
    err = capsys.readouterr().err
    log = Path(cfg.run_dir) / "logs" / "trainer-1.log"
    assert f"error: trainer-1 exited with code 3; log: {log}" in err
    assert "rank 1 failing on purpose" in err  # the log's last lines
    pids = all_pids(cfg.run_dir)
    assert len(pids) == 6  # server, 2 trainers, 3 grandchildren
    assert wait_gone(pids) == []


def test_trainers_start_while_the_servers_start(tmp_path):
    """Not colocated, trainers start with the servers, so their start-up overlaps the servers'. The
    stand-in server answers only once trainer-0 has started: were trainers started after /health,
    it never would (the 60 s startup timeout would fail the run)."""
    rc, cfg = run(
        tmp_path,
        '+launcher.server_env.FAKE_SERVER_WAIT_FILE="$AREAL_RUN_DIR/out/trainer-0.started"',
        "launcher.server_startup_timeout_s=60",
        "rollout.setup_timeout_s=5",
    )
    assert rc == 0
    assert set(outputs(cfg.run_dir)) >= {"trainer-0", "trainer-1"}
    # their client waits for /health as long as the launcher does
    written = yaml.safe_load((Path(cfg.run_dir) / "config.yaml").read_text())
    assert written["rollout"]["setup_timeout_s"] == 60


def test_a_trainer_that_fails_while_the_servers_start_is_named(tmp_path, capsys):
    """The server never answers; trainer-1 fails in its own start-up: the launcher names it then,
    instead of waiting out the servers' startup timeout (300 s)."""
    rc, cfg = run(
        tmp_path,
        '+launcher.server_env.FAKE_SERVER_WAIT_FILE="$AREAL_RUN_DIR/never"',
        '+launcher.trainer_env.FAKE_EXIT_AT_START="3"',
        "launcher.server_startup_timeout_s=300",
    )
    assert rc == 3
    err = capsys.readouterr().err
    assert re.search(
        r"error: trainer-\d exited with code 3 before the servers answered /health; log: \S+trainer-\d\.log", err
    ), err
    assert "failing at its start" in err  # the log's tail


def test_server_that_dies_while_starting_fails_the_run(tmp_path, capsys):
    rc, cfg = run(tmp_path, '+launcher.server_env.FAKE_SERVER_EXIT="4"')
    assert rc == 4
    assert "error: server-0 exited with code 4 before it was healthy" in capsys.readouterr().err
    assert not any(k.startswith("trainer") for k in outputs(cfg.run_dir))


def test_server_health_timeout(tmp_path, capsys):
    rc, cfg = run(tmp_path, '+launcher.server_env.FAKE_SERVER_DELAY_S="60"', "launcher.server_startup_timeout_s=1")
    assert rc == 1
    err = capsys.readouterr().err
    assert "error: server-0 did not answer" in err and "server-0.log" in err
    # it gave up at the startup timeout: the server, healthy after 60 s, never was
    assert not any(k.startswith("server") or k.startswith("trainer") for k in outputs(cfg.run_dir))


def test_server_stopped_while_starting_is_named_at_the_stopped_timeout(tmp_path, capsys):
    """A server stopped before it ever answered is named after launcher.stopped_timeout_s (1 s),
    not after the whole launcher.server_startup_timeout_s (300 s)."""
    rc, cfg = run(
        tmp_path,
        '+launcher.server_env.FAKE_SERVER_STOP="1"',
        "launcher.stopped_timeout_s=1",
        "launcher.server_startup_timeout_s=300",
    )
    assert rc == 1
    err = capsys.readouterr().err
    found = re.search(
        r"error: server-0 has been in the stopped state \(SIGSTOP\) for (\d+) s \(launcher.stopped_timeout_s=1\) "
        r"before it answered /health; to pause a run on purpose for longer, raise launcher.stopped_timeout_s",
        err,
    )
    assert found, err
    assert "server-0.log" in err
    assert not any(k.startswith("trainer") for k in outputs(cfg.run_dir))
    assert wait_gone(all_pids(cfg.run_dir)) == []


def test_taken_ports_move_to_the_next_free_one(tmp_path, capsys):
    base = free_ports(5)  # one block: two random draws can overlap, and then base+1 is the master port
    master = base + 3
    holders = []
    for port in (base, master):
        s = socket.socket()
        s.bind(("127.0.0.1", port))
        s.listen()
        holders.append(s)
    try:
        cfg = make_cfg(tmp_path, f"launcher.server_base_port={base}", f"launcher.trainer_master_port={master}")
        plan = make_plan(cfg)
        write_run_dir(cfg, plan)
        assert run_local(plan, cfg) == 0
    finally:
        for s in holders:
            s.close()
    console = capsys.readouterr().out
    assert f"server-0: port {base} is in use; using {base + 1}" in console
    assert f"MASTER_PORT {master} is in use; using {master + 1}" in console
    env = outputs(cfg.run_dir)["trainer-0"]["env"]
    assert env["AREAL_SERVER_ADDRS"] == f"127.0.0.1:{base + 1}" and env["MASTER_PORT"] == str(master + 1)


def test_inference_only_runs_the_driver(tmp_path):
    rc, cfg = run(tmp_path, "launcher.trainer_n_nodes=0")
    assert rc == 0
    out = outputs(cfg.run_dir)
    assert set(out) == {"driver-0", f"server-{cfg.launcher.server_base_port}"}
    assert out["driver-0"]["env"]["AREAL_SERVER_ADDRS"] == f"127.0.0.1:{cfg.launcher.server_base_port}"
    assert out["driver-0"]["env"]["RANK"] is None
    assert (Path(cfg.run_dir) / "logs" / "driver-0.log").exists()


def test_inference_only_driver_failure(tmp_path, capsys):
    rc, _ = run(
        tmp_path,
        "launcher.trainer_n_nodes=0",
        '+launcher.driver_env.FAKE_FAIL_RANK="0"',
        '+launcher.driver_env.FAKE_EXIT="5"',
    )
    assert rc == 5 and "error: driver-0 exited with code 5" in capsys.readouterr().err


def test_trainer_only_passes_configured_server_addrs(tmp_path):
    rc, cfg = run(tmp_path, "launcher.rollout_n_nodes=0", "rollout.server_addrs=[10.1.2.3:30000]")
    assert rc == 0
    assert outputs(cfg.run_dir)["trainer-1"]["env"]["AREAL_SERVER_ADDRS"] == "10.1.2.3:30000"


def test_server_exit_during_training_is_a_failure(tmp_path, capsys):
    """A server dying mid-run fails the run even with status 0 (the trainers would hang)."""
    cfg = make_cfg(
        tmp_path,
        f"launcher.server_base_port={free_ports(2)}",
        f"launcher.trainer_master_port={free_ports(1)}",
        '+launcher.trainer_env.FAKE_SLEEP_S="300"',
    )
    plan = make_plan(cfg)
    srv = plan.by_role("server")[0]
    srv.command = [srv.command[0], "-c", _SERVE_THEN_EXIT, str(srv.port)]
    write_run_dir(cfg, plan)
    assert run_local(plan, cfg) == 1
    assert "error: server-0 exited with code 0 while the run still needed it" in capsys.readouterr().err
    assert not any(ran_out(cfg, r) for r in (0, 1))  # stopped, not waited out
    assert wait_gone(all_pids(cfg.run_dir)) == []


# Serves /health, then exits 0 after 3 s; given a marker path, a start that finds the marker (a
# restart) serves until stopped instead.
_SERVE_THEN_EXIT = """
import os, sys, threading, time
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
srv = HTTPServer(("127.0.0.1", int(sys.argv[1])), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
marker = sys.argv[2] if len(sys.argv) > 2 else None
if marker and os.path.exists(marker):
    time.sleep(600)
if marker:
    open(marker, "w").close()
time.sleep(3)
"""


def test_restart_failed_servers(tmp_path, capsys):
    """With launcher.restart_failed_servers the dead server comes back at its address and the run
    goes on; trainers keep the same server address."""
    # the trainers run until the server is back (not a fixed time that its 3 s life must beat)
    cfg = make_cfg(
        tmp_path,
        f"launcher.server_base_port={free_ports(2)}",
        f"launcher.trainer_master_port={free_ports(1)}",
        '+launcher.trainer_env.FAKE_UNTIL_RESTARTED="server-0"',
        "launcher.restart_failed_servers=true",
    )
    plan = make_plan(cfg)
    srv = plan.by_role("server")[0]
    srv.command = [srv.command[0], "-c", _SERVE_THEN_EXIT, str(srv.port), str(tmp_path / "served_once")]
    write_run_dir(cfg, plan)
    assert run_local(plan, cfg) == 0
    captured = capsys.readouterr()
    assert "server-0 exited with code 0 while the run still needed it; restarting it at" in captured.err
    assert "server-0 is back at" in captured.out
    assert (Path(cfg.run_dir) / "logs" / "server-0.log").read_text().count("=== server-0 started") >= 2


def test_server_compiling_kernels_is_waited_for_not_failed(tmp_path, capsys, monkeypatch):
    """A server that goes silent with a compiler in its process tree (SGLang's scheduler building
    flashinfer's kernels) is given launcher.server_startup_timeout_s (30 s) instead of the health
    timeout (1 s), and named as compiling; once the build ends and it answers, the run completes."""
    cfg, plan = compiling_server_run(tmp_path, monkeypatch)
    assert run_local(plan, cfg) == 0
    check_compiling_server_run(cfg, capsys.readouterr().out)


def test_killed_rank_is_named_not_the_peer_that_exits_after_it(tmp_path, capsys):
    """Rank 0 SIGKILLs rank 1 and exits 3 at once (a peer whose collective broke): the launcher
    often finds both dead in one poll, and must name the killed rank and exit 137."""
    rc, cfg = run(
        tmp_path,
        '+launcher.trainer_env.FAKE_KILL_PEER="1"',
        '+launcher.trainer_env.FAKE_EXIT="3"',
        '+launcher.trainer_env.FAKE_SLEEP_S="300"',
    )
    assert rc == 137
    err = capsys.readouterr().err
    assert "error: trainer-1 was killed by SIGKILL (exit code 137)" in err
    assert "error: trainer-0" not in err
    assert wait_gone(all_pids(cfg.run_dir)) == []


def test_cause_first_puts_a_signal_death_before_error_exits():
    exits = [("server-0", 0), ("trainer-0", 1), ("trainer-1", -9), ("trainer-2", -15), ("trainer-3", 0)]
    assert cause_first(exits) == [
        ("server-0", 0),
        ("trainer-3", 0),
        ("trainer-1", -9),
        ("trainer-2", -15),
        ("trainer-0", 1),
    ]
