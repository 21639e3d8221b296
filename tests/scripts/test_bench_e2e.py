"""scripts/bench_e2e.py: a CPU smoke run through areal-launch (sync and one async mode, tiny model,
real GSM8K prompts), and its GPU-only pieces (utilization sampler, measured window) against a fake
nvidia-smi. No timing asserts: the numbers of a loaded 2-core machine mean nothing."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GSM8K = REPO.parent / "shared" / "data" / "gsm8k" / "train.jsonl"


def _script():
    sys.path.insert(0, str(REPO / "scripts"))  # the script imports bench_train as its sibling
    spec = importlib.util.spec_from_file_location("bench_e2e", REPO / "scripts" / "bench_e2e.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def gsm8k_file(tmp_path):
    """A few real GSM8K rows (the shared copy when present, else two written here)."""
    path = tmp_path / "gsm8k" / "train.jsonl"
    path.parent.mkdir()
    if GSM8K.exists():
        path.write_text("".join(GSM8K.read_text().splitlines(keepends=True)[:16]))
    else:
        rows = [{"question": f"Tom has {i} apples and buys 2 more. How many apples does he have?",
                 "answer": f"{i} + 2 = {i + 2}\n#### {i + 2}"} for i in range(16)]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.slow
def test_cpu_smoke_sync_and_async(tmp_path, gsm8k_file):
    out = tmp_path / "e2e.json"
    rc = _script().main([
        "--device", "cpu", "--shape", "tiny", "--batch-size", "2", "--n-samples", "2", "--max-new-tokens", "4",
        "--steps", "1", "--warmup", "1", "--ppo-minibatches", "1", "--offpolicyness", "0", "2",
        "--data", str(gsm8k_file), "--workdir", str(tmp_path / "work"), "--out", str(out),
        "--port-base", "31450", "--master-port-base", "29450"])
    result = json.loads(out.read_text())
    assert rc == 0, {k: m.get("log_tail") for k, m in result["modes"].items()}
    assert set(result["modes"]) == {"sync", "async2"}
    for name, m in result["modes"].items():
        assert m["status"] == "ok" and m["returncode"] == 0
        assert m["steps_completed"] == m["steps_expected"] == 2 and m["measured_steps"] == 1
        assert m["samples_per_step"] == 4 and m["gen_tokens_per_step"] == 16 and m["fixed_lengths_ok"]
        assert m["samples_per_s"] > 0 and m["gen_tokens_per_s"] > 0
        assert m["phase_s_mean"]["train"] > 0 and m["weight_update_s_mean"] is not None
        assert m["gpu"] is None  # no GPU sampling on CPU
    assert result["modes"]["sync"]["staleness_max"] == 0
    assert set(result["speedup"]) == {"async2_vs_sync"} and result["speedup"]["async2_vs_sync"] > 0
    assert result["balance"]["sync_generation_s"] > 0 and result["balance"]["async_ceiling"] >= 1.0
    assert result["hardware"]["device"] == "cpu" and result["config"]["shape"] == "tiny"
    assert "gconfig.ignore_eos=true" in result["config"]["overrides_example"]


def test_gpu_sampler_and_measured_window(tmp_path, monkeypatch):
    """The CUDA-only path on CPU: a fake nvidia-smi answers the query the sampler sends."""
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nprintf '0, 80, 1000\\n1, 20, 3000\\n'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    mod = _script()
    sampler = mod.GpuSampler([0, 1], 0.02)
    monkeypatch.setattr(sampler, "_pynvml_reader", lambda: None)
    start = time.time()
    sampler.start()
    time.sleep(0.5)
    sampler.stop()
    assert sampler.source == "nvidia-smi" and len(sampler.samples) >= 4
    end = time.time()
    server, trainer = sampler.summary(0, start, end), sampler.summary(1, start, end)
    assert server["busy_fraction"] == pytest.approx(0.8) and trainer["busy_fraction"] == pytest.approx(0.2)
    assert server["peak_memory_mib"] == 1000 and trainer["samples"] >= 2
    assert sampler.summary(0, None, None)["busy_fraction"] is None

    # summarise: the window runs from the last warm-up step's arrival to the last step's
    args = mod.parse_args(["--out", "x", "--steps", "2", "--warmup", "1", "--batch-size", "2",
                           "--n-samples", "2", "--max-new-tokens", "4"])
    rows = [{"step": s, "timing/step_s": 1.0, "rollout/n_samples": 4, "rollout/gen_tokens": 16,
             "timing/rollout_s": 0.5, "timing/train_s": 0.4} for s in (1, 2, 3)]
    got = mod.summarise(args, 2, rows, [start, start + 0.2, end], sampler, start - 5)
    assert got["measured_steps"] == 2 and got["samples_per_s"] == pytest.approx(4.0)
    assert got["fixed_lengths_ok"] and got["startup_s"] == pytest.approx(4.0)
    assert got["gpu"]["server"]["busy_fraction"] == pytest.approx(0.8)
    b = mod.balance({"sync": {**got, "step_s_mean": 1.0}})
    assert b["async_ceiling"] == pytest.approx(1.0 / 0.6)


def test_gpu_summary_line_skips_the_source_entry():
    text = _script()._gpu_text({"server": {"busy_fraction": 0.5}, "trainer": {"busy_fraction": 0.25},
                                "source": "pynvml"})
    assert text == "; server GPU busy 50%, trainer GPU busy 25%"
