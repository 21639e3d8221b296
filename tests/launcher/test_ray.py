"""The Ray backend on a real local multi-node Ray cluster (ray.cluster_utils.Cluster, CPU only).

One cluster for the module: a head and two worker nodes, each tagged with a custom resource
(node_a, node_b, node_c) so a test can say which Ray node a process ran on. Processes are the
/health stand-in server and fake trainers; each writes its Ray node id, which the tests map back
to a tag.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.cli import write_run_dir
from tests.launcher.helpers import (
    REPO,
    all_pids,
    check_compiling_server_run,
    compiling_server_run,
    free_ports,
    make_cfg,
    make_plan,
    outputs,
    repo_env,
    run_dir_of,
    wait_gone,
    write_yaml,
)

ray_cluster_utils = pytest.importorskip("ray.cluster_utils")
pytestmark = pytest.mark.slow

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(autouse=True)
def launcher_default_threads(monkeypatch):
    """The launcher passes a user's OMP_NUM_THREADS to every node; without the suite's
    (tests/conftest.py) these runs see its own per-node default."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


@pytest.fixture(scope="module")
def cluster():
    from launcher.ray import LOCAL_RAY_OPTIONS

    c = ray_cluster_utils.Cluster(
        initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"node_a": 1}, **LOCAL_RAY_OPTIONS}
    )
    tags = {c.head_node.node_id: "a"}
    for tag in "bc":
        tags[c.add_node(num_cpus=2, resources={f"node_{tag}": 1}).node_id] = tag
    c.wait_for_nodes()
    c.tags = tags
    yield c
    c.shutdown()


def on_three_nodes(cluster) -> list[str]:
    """Servers on one Ray node, trainers on two others (fsdp:d2: one rank per node)."""
    return [
        "launcher.backend=ray",
        f"launcher.ray_address={cluster.address}",
        "cluster.n_nodes=3",
        "cluster.n_gpus_per_node=1",
        "launcher.rollout_n_nodes=1",
        "launcher.trainer_n_nodes=2",
    ]


def ray_cfg(tmp_path, cluster, *overrides):
    """on_three_nodes, with free ports."""
    return make_cfg(
        tmp_path,
        *on_three_nodes(cluster),
        f"launcher.server_base_port={free_ports(2)}",
        f"launcher.trainer_master_port={free_ports(1)}",
        *overrides,
    )


def run_ray_plan(cfg):
    from launcher.ray import run_ray

    plan = make_plan(cfg)
    write_run_dir(cfg, plan)
    return run_ray(plan, cfg), plan


def node_tag(cluster, info: dict) -> str:
    node_id = info.get("ray_node_id") or info["env"]["AREAL_RAY_NODE_ID"]
    return cluster.tags[node_id]


def test_plan_nodes_map_to_distinct_ray_nodes(tmp_path, cluster, capsys):
    cfg = ray_cfg(tmp_path, cluster)
    rc, plan = run_ray_plan(cfg)
    console = capsys.readouterr().out
    assert rc == 0, console
    out = outputs(cfg.run_dir)
    server = out[f"server-{cfg.launcher.server_base_port}"]
    t0, t1 = out["trainer-0"], out["trainer-1"]
    # Plan nodes 0 (server), 1 (trainer-0), 2 (trainer-1) each on their own Ray node.
    assert sorted({node_tag(cluster, server), node_tag(cluster, t0), node_tag(cluster, t1)}) == ["a", "b", "c"]
    assert [p.node for p in plan.processes] == [0, 1, 2]
    # TRAINER_HEAD became the IP of trainer rank 0's node; the rendezvous env is complete.
    assert t0["env"]["MASTER_ADDR"] == t1["env"]["MASTER_ADDR"] == t0["env"]["AREAL_NODE_IP"]
    assert t1["env"]["MASTER_PORT"] == str(cfg.launcher.trainer_master_port)
    assert (t1["env"]["RANK"], t1["env"]["WORLD_SIZE"], t1["env"]["LOCAL_RANK"]) == ("1", "2", "0")
    addr = t0["env"]["AREAL_SERVER_ADDRS"]
    assert addr.endswith(f":{cfg.launcher.server_base_port}") and t1["healthy"] == {addr: True}
    assert t0["record"] == {"addrs": [addr]} and t0["cwd"] == os.getcwd()
    assert server["omp"] == "2" and t0["env"]["CUDA_VISIBLE_DEVICES"] == ""  # 2 CPUs per node, 1 process
    logs = Path(cfg.run_dir) / "logs"
    assert "trainer 1 done" in (logs / "trainer-1.log").read_text()
    assert "fake server ready" in (logs / "server-0.log").read_text()
    assert "[trainer-1] trainer 1 done" in console and "plan node 2 -> Ray node" in console
    assert wait_gone(all_pids(cfg.run_dir)) == []


@pytest.fixture
def crashing_host(monkeypatch):
    """launcher.ray with CrashingHost as its actor class; yields the ticket to write."""
    from tests.launcher import crash_host

    monkeypatch.setattr("launcher.ray.ProcessHost", crash_host.CrashingHost)
    crash_host.TICKET.unlink(missing_ok=True)
    yield crash_host.TICKET
    crash_host.TICKET.unlink(missing_ok=True)


def test_actor_whose_worker_crashed_at_start_is_replaced(tmp_path, cluster, capsys, crashing_host):
    """A Ray worker that dies before its actor ran (Ray 2.60's metrics thread once segfaulted one in
    CI) costs one more actor, not the launch."""
    crashing_host.write_text("trainer-1 once")
    cfg = ray_cfg(tmp_path, cluster)
    rc, _ = run_ray_plan(cfg)
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert not crashing_host.exists()  # the first worker of trainer-1's actor did die
    assert "trainer-1: the Ray worker of its actor died before the actor ran" in captured.err
    assert "starting another (attempt 2 of 2)" in captured.err
    assert "trainer 1 done" in (Path(cfg.run_dir) / "logs" / "trainer-1.log").read_text()
    assert wait_gone(all_pids(cfg.run_dir)) == []


def test_actor_whose_worker_keeps_crashing_ends_the_launch(tmp_path, cluster, capsys, crashing_host):
    crashing_host.write_text("server-0 always")
    cfg = ray_cfg(tmp_path, cluster)
    rc, _ = run_ray_plan(cfg)
    err = capsys.readouterr().err
    assert rc == 1, err
    assert "error: server-0: the Ray worker of its actor died before the actor ran (" in err
    assert "), on each of 2 attempts" in err
    assert "worker-*.err" in err
    assert not list(Path(cfg.run_dir).glob("out/*.json"))  # nothing was started


def test_failure_tears_down_every_node(tmp_path, cluster, capsys):
    """Runs right after a successful run: it also shows that run released its placement group."""
    cfg = ray_cfg(
        tmp_path,
        cluster,
        '+launcher.trainer_env.FAKE_FAIL_RANK="1"',
        '+launcher.trainer_env.FAKE_EXIT="3"',
        '+launcher.trainer_env.FAKE_FAIL_AFTER_S="1"',
        '+launcher.trainer_env.FAKE_SLEEP_S="300"',
        '+launcher.trainer_env.FAKE_SPAWN_CHILD="1"',
        '+launcher.trainer_env.FAKE_IGNORE_TERM="1"',
        '+launcher.server_env.FAKE_SERVER_SPAWN_CHILD="1"',
    )
    rc, _ = run_ray_plan(cfg)
    assert rc == 3
    captured = capsys.readouterr()
    assert "trainer 0 done" not in captured.out  # stopped on rank 1's failure, not waited out (300 s)
    err = captured.err
    assert f"error: trainer-1 exited with code 3; log: {Path(cfg.run_dir) / 'logs' / 'trainer-1.log'}" in err
    assert "rank 1 failing on purpose" in err
    pids = all_pids(cfg.run_dir)
    assert len(pids) == 6 and wait_gone(pids) == []


def test_stopped_trainer_on_a_ray_node_is_named(tmp_path, cluster, capsys):
    """launcher.stopped_timeout_s through the Ray backend: each process's actor reports the
    stopped state with its output, and the launcher fails the run naming the process."""
    cfg = ray_cfg(
        tmp_path,
        cluster,
        "launcher.stopped_timeout_s=1",
        '+launcher.trainer_env.FAKE_STOP_RANK="1"',
        '+launcher.trainer_env.FAKE_SLEEP_S="300"',
    )
    rc, _ = run_ray_plan(cfg)
    err = capsys.readouterr().err
    assert rc == 1, err
    log = Path(cfg.run_dir) / "logs" / "trainer-1.log"
    assert re.search(
        r"error: trainer-1 has been in the stopped state \(SIGSTOP\) for \d+ s \(launcher.stopped_timeout_s=1\)"
        rf".*; log: {re.escape(str(log))}",
        err,
    ), err
    assert wait_gone(all_pids(cfg.run_dir)) == []


# Serves /health. The first start (no marker yet) stops itself with SIGSTOP once it answered a
# probe, and says on SIGTERM what SGLang's HTTP process says then: an ERROR record about its
# scheduler. A restart serves on.
_STOP_ONCE_THEN_SERVE = """
import os, signal, sys, threading, time
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
srv = HTTPServer(("127.0.0.1", int(sys.argv[1])), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
print("stand-in server ready", flush=True)
record = os.path.join(os.environ["AREAL_RUN_DIR"], "name_resolve", "servers.json")
deadline = time.monotonic() + 120
while not os.path.exists(record) and time.monotonic() < deadline:  # the launcher found it healthy
    time.sleep(0.05)
if not os.path.exists(sys.argv[2]) and os.path.exists(record):
    open(sys.argv[2], "w").close()
    def on_term(*_):
        print("2026-12-06 04:58:36,963 sglang.srt.utils.watchdog ERROR Subprocess scheduler_0 (pid=1) "
              "crashed with exit code -15. Triggering SIGQUIT for cleanup...", flush=True)
        os._exit(143)
    signal.signal(signal.SIGTERM, on_term)
    os.kill(os.getpid(), signal.SIGSTOP)
time.sleep(600)
"""


def test_restart_keeps_the_old_servers_last_lines_off_the_console(tmp_path, cluster, capsys):
    """A stopped server restarted on Ray: what it prints while the launcher stops it goes to its
    log only. The actor's queue once handed those lines to the new process's console view, so a
    GPU run showed SGLang's "crashed with exit code -15" after a restart it had asked for."""
    cfg = ray_cfg(
        tmp_path,
        cluster,
        "launcher.restart_failed_servers=true",
        "launcher.stopped_timeout_s=1",
        '+launcher.trainer_env.FAKE_UNTIL_RESTARTED="server-0"',
    )
    plan = make_plan(cfg)
    srv = plan.by_role("server")[0]
    srv.command = [sys.executable, "-c", _STOP_ONCE_THEN_SERVE, str(srv.port), str(tmp_path / "stopped_once")]
    write_run_dir(cfg, plan)
    from launcher.ray import run_ray

    rc = run_ray(plan, cfg)
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "server-0 has been in the stopped state (SIGSTOP)" in captured.err
    assert "server-0 is back at" in captured.out
    log = (Path(cfg.run_dir) / "logs" / "server-0.log").read_text()
    assert log.count("=== server-0 started") == 2
    # the old one's line is in the log, before the second start
    assert log.index("crashed with exit code -15") < log.rindex("=== server-0 started")
    assert "crashed with exit code -15" not in captured.out + captured.err
    assert wait_gone(all_pids(cfg.run_dir)) == []


def test_server_compiling_kernels_on_a_ray_node_is_waited_for(tmp_path, cluster, capsys, monkeypatch):
    """As on the local backend (test_local_run): the server's actor tells the launcher which
    compiler runs in its tree, and the launcher waits for the build past the health timeout."""
    cfg, plan = compiling_server_run(tmp_path, monkeypatch, *on_three_nodes(cluster))
    from launcher.ray import run_ray

    assert run_ray(plan, cfg) == 0
    check_compiling_server_run(cfg, capsys.readouterr().out)


def test_server_stopped_while_starting_on_a_ray_node_is_named(tmp_path, cluster, capsys):
    """The actor reports a stopped server before it ever answered, and the launcher names it at
    launcher.stopped_timeout_s instead of waiting out the startup timeout."""
    cfg = ray_cfg(
        tmp_path,
        cluster,
        '+launcher.server_env.FAKE_SERVER_STOP="1"',
        "launcher.stopped_timeout_s=1",
        "launcher.server_startup_timeout_s=300",
    )
    rc, _ = run_ray_plan(cfg)
    err = capsys.readouterr().err
    assert rc == 1, err
    assert "error: server-0 has been in the stopped state (SIGSTOP) for" in err
    assert "(launcher.stopped_timeout_s=1) before it answered /health" in err
    assert wait_gone(all_pids(cfg.run_dir)) == []


def test_cli_trainer_only_on_two_nodes(tmp_path, cluster):
    """areal-launch end to end with launcher.backend=ray: trainers on two Ray nodes."""
    fileroot = tmp_path / "runs"
    yaml = write_yaml(tmp_path / "exp.yaml", fileroot=fileroot, rollout_nodes=0)
    args = [
        sys.executable,
        "-m",
        "launcher.cli",
        "--config",
        yaml,
        "launcher.backend=ray",
        f"launcher.ray_address={cluster.address}",
        "cluster.n_nodes=2",
        "cluster.n_gpus_per_node=1",
        "launcher.trainer_n_nodes=2",
        "rollout.server_addrs=[127.0.0.1:1]",
    ]
    done = subprocess.run(args, cwd=REPO, env=repo_env(), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    out = outputs(run_dir_of(fileroot))
    assert node_tag(cluster, out["trainer-0"]) != node_tag(cluster, out["trainer-1"])
    assert out["trainer-1"]["env"]["MASTER_ADDR"] == out["trainer-0"]["env"]["AREAL_NODE_IP"]
    assert out["trainer-0"]["env"]["AREAL_SERVER_ADDRS"] == "127.0.0.1:1"


def test_sigterm_stops_processes_on_every_node(tmp_path, cluster):
    fileroot = tmp_path / "runs"
    args = [
        sys.executable,
        "-m",
        "tests.launcher.run_plan",
        str(fileroot),
        "launcher.backend=ray",
        f"launcher.ray_address={cluster.address}",
        "cluster.n_nodes=3",
        "cluster.n_gpus_per_node=1",
        "launcher.rollout_n_nodes=1",
        "launcher.trainer_n_nodes=2",
        f"launcher.server_base_port={free_ports(2)}",
        f"launcher.trainer_master_port={free_ports(1)}",
        '+launcher.trainer_env.FAKE_SLEEP_S="300"',
        '+launcher.trainer_env.FAKE_SPAWN_CHILD="1"',
        '+launcher.trainer_env.FAKE_IGNORE_TERM="1"',
    ]
    proc = subprocess.Popen(args, cwd=REPO, env=repo_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out_dir = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        found = list(fileroot.glob("*/*/out/trainer-*.json"))
        if len(found) == 2:
            out_dir = found[0].parent
            break
        time.sleep(0.2)
    assert out_dir is not None, proc.communicate(timeout=30)[0]
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=120)[0]  # only a hang guard: the trainers sleep 300 s
    assert proc.returncode == 143, output
    assert not re.search(r"trainer \d done", output), output  # stopped, not waited out
    pids = all_pids(out_dir.parent)
    assert len(pids) == 5 and wait_gone(pids) == []
