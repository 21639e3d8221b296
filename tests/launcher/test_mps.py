"""launcher.mps: config rules, the plan's environment, the preflight, and the daemon's life in a
local run. NVIDIA's control program cannot run without a GPU driver, so these run the stand-in
in tests/launcher/mps_control_standin (same command line and commands); the GPU test
(tests/launcher/gpu/test_mps_gpu.py) runs the real one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from areal.config import ConfigError, validate_config
from areal.infra.host import HostFacts
from launcher import mps
from launcher.cli import write_run_dir
from launcher.local import run_local
from launcher.plan import MpsPlan, make_plan, mps_pipe_dir
from launcher.preflight import mps_issues
from launcher.procs import LaunchError
from tests.launcher.helpers import all_pids, free_ports, make_cfg, wait_gone
from tests.launcher.helpers import make_plan as make_stand_in_plan

STANDIN = Path(__file__).parent / "mps_control_standin"
GPU = HostFacts(cuda_available=True, python="python")


def colocated(**launcher):
    raw = {
        "actor": {"path": "/m", "backend": "fsdp:d1", "weight_update": "tensor"},
        "rollout": {"backend": "sglang:d1"},
        "train_dataset": {"path": "/d", "batch_size": 8},
        "cluster": {"n_gpus_per_node": 1, "device": "cuda"},
        "sglang": {"mem_fraction_static": 0.3},
        "launcher": {"colocate": True, **launcher},
    }
    return validate_config(raw)


@pytest.fixture
def standin_on_path(monkeypatch):
    monkeypatch.setenv("PATH", f"{STANDIN}{os.pathsep}{os.environ['PATH']}")


# ---- config and plan ----------------------------------------------------------------------------


def test_plan_points_every_process_at_the_runs_daemon():
    cfg = colocated(mps=True, mps_server_sm_percent=60, mps_server_priority="below_normal")
    plan = make_plan(cfg, GPU)
    assert plan.mps == MpsPlan(devices=[0], pipe_dir=mps_pipe_dir(cfg.run_dir), log_dir=f"{cfg.run_dir}/logs/mps")
    assert len(plan.mps.pipe_dir) < 40  # the daemon's sockets must fit the 108-byte unix path limit
    for p in plan.processes:
        assert p.env["CUDA_MPS_PIPE_DIRECTORY"] == plan.mps.pipe_dir
        assert p.env["CUDA_MPS_LOG_DIRECTORY"] == plan.mps.log_dir
    server, trainer = plan.by_role("server")[0], plan.by_role("trainer")[0]
    assert server.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "60"  # the servers' share only
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in trainer.env
    assert server.env["CUDA_MPS_CLIENT_PRIORITY"] == "1" and "CUDA_MPS_CLIENT_PRIORITY" not in trainer.env
    assert "CUDA_MPS_CLIENT_PRIORITY" not in make_plan(colocated(mps=True), GPU).by_role("server")[0].env
    assert f"mps: a control daemon for devices [0], pipes in {plan.mps.pipe_dir}" in plan.describe()
    assert json.loads(plan.to_json())["mps"]["devices"] == [0]


def test_plan_without_mps_has_no_daemon():
    plan = make_plan(colocated(), GPU)
    assert plan.mps is None and json.loads(plan.to_json())["mps"] is None
    assert not any("CUDA_MPS_PIPE_DIRECTORY" in p.env for p in plan.processes)


def test_runs_that_mps_cannot_serve_are_refused_naming_the_key():
    cases = [
        ({"colocate": False, "mps": True}, "launcher.mps", "launcher.colocate=true"),
        ({"mps": True, "backend": "ray"}, "launcher.mps", "launcher.backend=local"),
        ({"mps_server_sm_percent": 50}, "launcher.mps_server_sm_percent", "launcher.mps=true"),
        ({"mps_server_priority": "below_normal"}, "launcher.mps_server_priority", "launcher.mps=true"),
    ]
    for launcher, key, fix in cases:
        with pytest.raises(ConfigError) as err:
            colocated(**launcher)
        assert key in str(err.value) and fix in str(err.value)
    with pytest.raises(ConfigError, match="launcher.mps_server_sm_percent"):
        colocated(mps=True, mps_server_sm_percent=0)


def test_preflight_needs_a_gpu_and_the_control_program(monkeypatch, standin_on_path):
    cfg = colocated(mps=True)
    assert mps_issues(cfg, GPU) == []  # the program is on PATH
    (issue,) = mps_issues(cfg, HostFacts(cuda_available=False, python="python"))
    assert issue.key == "launcher.mps" and "no CUDA GPU" in str(issue)
    monkeypatch.setenv("PATH", "/nonexistent")
    (issue,) = mps_issues(cfg, GPU)
    assert issue.key == "launcher.mps" and "nvidia-cuda-mps-control is not on PATH" in str(issue)


# ---- the daemon ---------------------------------------------------------------------------------


def daemon_plan(tmp_path) -> MpsPlan:
    return MpsPlan(devices=[0], pipe_dir=mps_pipe_dir(str(tmp_path)), log_dir=str(tmp_path / "logs" / "mps"))


def test_daemon_starts_lists_its_clients_and_quits(tmp_path, standin_on_path):
    daemon = mps.MpsDaemon(daemon_plan(tmp_path), dict(os.environ))
    daemon.start()
    try:
        assert daemon.answers() and daemon.clients() == []
        with pytest.raises(LaunchError, match="already answers"):  # a second daemon on the same pipes
            mps.MpsDaemon(daemon_plan(tmp_path), dict(os.environ)).start()
        tree = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                                 "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                                 "time.sleep(60)"])  # fmt: skip
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            child = wait_for_child(tree.pid)
            Path(daemon.plan.pipe_dir, "clients").write_text(f"{child}\n")  # the tree's child attached
            assert daemon.clients() == [child]
            assert daemon.attached({"server-0": tree.pid, "trainer-0": other.pid}) == {
                "server-0": [child],
                "trainer-0": [],
            }
            mps_server = mps.pids(daemon.ask("get_server_list"))
            assert len(mps_server) == 1 and psutil.Process(mps_server[0]).ppid() == daemon.proc.pid
        finally:
            for p in psutil.Process(tree.pid).children(recursive=True) + [psutil.Process(tree.pid), other]:
                p.kill()
    finally:
        daemon.stop(grace_s=5)
    assert daemon.proc.poll() == 0  # it quit when asked, rather than being killed
    assert wait_gone(mps_server) == [] and not Path(daemon.plan.pipe_dir).exists()


def wait_for_child(pid: int) -> int:
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        children = psutil.Process(pid).children()
        if children:
            return children[0].pid
        time.sleep(0.05)
    raise TimeoutError(f"process {pid} started no child within 30 s")


def test_a_daemon_that_cannot_start_is_named_with_its_output(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    program = bin_dir / mps.CONTROL
    program.write_text("#!/bin/sh\necho 'An MPS server is not supported in this compute mode'\nexit 3\n")
    program.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(LaunchError) as err:
        mps.MpsDaemon(daemon_plan(tmp_path), dict(os.environ)).start()
    text = str(err.value)
    assert "launcher.mps=true" in text and "exited with code 3" in text
    assert "not supported in this compute mode" in text and "launcher.mps=false" in text


def test_attach_watch_names_processes_that_never_attached(tmp_path, standin_on_path):
    daemon = mps.MpsDaemon(daemon_plan(tmp_path), dict(os.environ))
    daemon.start()
    said: list[str] = []
    try:
        watch = mps.AttachWatch(daemon, ["server-0", "trainer-0"], timeout_s=0.0, say=said.append, every_s=0.0)
        watch.poll({"server-0": os.getpid()})  # no client at all, the trainer not started, and the time is up
        watch.poll({"server-0": os.getpid()})  # said once
    finally:
        daemon.stop(grace_s=5)
    assert len(said) == 1 and said[0].startswith("warning: launcher.mps: server-0, trainer-0 did not attach")
    record = json.loads(Path(daemon.plan.log_dir, "attached.json").read_text())
    assert record == {"attached": {}, "missing": ["server-0", "trainer-0"], "mps_servers": []}


def test_a_run_that_ends_first_still_records_what_attached(tmp_path, standin_on_path):
    daemon = mps.MpsDaemon(daemon_plan(tmp_path), dict(os.environ))
    daemon.start()
    said: list[str] = []
    try:
        Path(daemon.plan.pipe_dir, "clients").write_text(f"{os.getpid()}\n")  # this process "attached"
        watch = mps.AttachWatch(daemon, ["server-0", "trainer-0"], timeout_s=600, say=said.append, every_s=0.0)
        watch.poll({"server-0": os.getpid()})  # the trainer has not started: keep waiting
        assert not watch.done and said == []
        watch.finish({"server-0": os.getpid()})  # the run ends
    finally:
        daemon.stop(grace_s=5)
    record = json.loads(Path(daemon.plan.log_dir, "attached.json").read_text())
    assert record["attached"] == {"server-0": [os.getpid()]} and record["missing"] == ["trainer-0"]
    assert len(record["mps_servers"]) == 1 and said == []


# ---- a local run --------------------------------------------------------------------------------


def stand_in_mps_run(tmp_path):
    """A local run of fake processes under the stand-in daemon; trainer rank 0 waits for the
    launcher's attach record (attached.json) before it finishes."""
    ports = [f"launcher.server_base_port={free_ports(2)}", f"launcher.trainer_master_port={free_ports(1)}"]
    cfg = make_cfg(tmp_path, *ports)
    attached = Path(cfg.run_dir) / "logs" / "mps" / "attached.json"
    cfg.launcher.trainer_env["FAKE_WAIT_FILE"] = str(attached)
    plan = make_stand_in_plan(cfg)
    plan.mps = MpsPlan(devices=[0], pipe_dir=mps_pipe_dir(cfg.run_dir), log_dir=str(attached.parent))
    for p in plan.processes:  # what make_plan gives a CUDA run
        p.env.update(plan.mps.env())
    write_run_dir(cfg, plan)
    return cfg, plan, attached


def test_local_run_starts_the_daemon_first_and_quits_it_last(tmp_path, standin_on_path, monkeypatch, capsys):
    """The stand-in server and fake trainers attach as CUDA processes would; rank 0 waits for the
    launcher's attach record before it finishes, so the check happens while all of them run."""
    monkeypatch.setattr(mps, "ATTACH_CHECK_S", 0.1)
    cfg, plan, attached = stand_in_mps_run(tmp_path)
    assert run_local(plan, cfg) == 0
    console = capsys.readouterr().out
    assert console.index("started the MPS control daemon") < console.index("started server-0")
    assert "mps: server-0, trainer-0, trainer-1 attached (MPS server pid " in console
    record = json.loads(attached.read_text())
    assert sorted(record["attached"]) == ["server-0", "trainer-0", "trainer-1"] and record["missing"] == []
    assert "stand-in MPS control daemon quits" in (attached.parent / "foreground.log").read_text()
    assert not Path(plan.mps.pipe_dir).exists()
    assert wait_gone(all_pids(cfg.run_dir) + record["mps_servers"]) == []


def test_a_daemon_that_exits_mid_run_is_reported_and_the_run_goes_on(tmp_path, standin_on_path, monkeypatch, capsys):
    """The stand-in daemon exits once all three processes attached (its server gone too); the
    launcher says so once, naming the daemon's logs, and the run still ends cleanly."""
    monkeypatch.setattr(mps, "ATTACH_CHECK_S", 0.1)
    monkeypatch.setenv("STANDIN_EXIT_AFTER_CLIENTS", "3")
    cfg, plan, attached = stand_in_mps_run(tmp_path)
    assert run_local(plan, cfg) == 0
    console = capsys.readouterr().out
    notice = "warning: launcher.mps: the MPS control daemon (pid "
    assert console.count(notice) == 1 and "exited with code 3 while the run went on" in console
    assert f"Its logs: {attached.parent}" in console
    assert sorted(json.loads(attached.read_text())["attached"]) == ["server-0", "trainer-0", "trainer-1"]
    assert "exits on its own" in (attached.parent / "foreground.log").read_text()
    assert not Path(plan.mps.pipe_dir).exists()
