"""scripts/bench_train.py --backend: the layout checks (fast) and a 2-process tensor-parallel CPU
run through torchrun, plain and with --fused-logprobs (slow, about 20 s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SMALL = [
    "--shape",
    "tiny",
    "--device",
    "cpu",
    "--steps",
    "1",
    "--warmup",
    "1",
    "--seqs",
    "8",
    "--min-len",
    "8",
    "--max-len",
    "32",
    "--max-tokens-per-mb",
    "64",
    "--skip-bare",
]


def test_backend_must_match_the_process_count(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "bench_train.py"),
            *SMALL,
            "--backend",
            "fsdp:d2r2",
            "--workdir",
            str(tmp_path / "w"),
            "--out",
            str(tmp_path / "x.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert r.returncode == 2 and "uses 2 processes (d x t) but 1 were started" in r.stderr


@pytest.mark.slow
@pytest.mark.second_lane
@pytest.mark.parametrize("backend,dp,tp", [("fsdp:d1t2", 1, 2)])
def test_two_process_layout_on_cpu(tmp_path, backend, dp, tp):
    out = tmp_path / "train.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            "29783",
            str(REPO / "scripts" / "bench_train.py"),
            *SMALL,
            "--backend",
            backend,
            "--fused-logprobs",
            "--workdir",
            str(tmp_path / "w"),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(out.read_text())
    assert (result["backend"], result["dp"], result["tp"], result["world_size"]) == (backend, dp, tp, 2)
    engine = result["engine"]
    assert engine["tokens_per_s"] > 0 and engine["tokens_per_s_per_device"] == pytest.approx(engine["tokens_per_s"] / 2)
    assert engine["real_tokens"] > 0 and engine["loss"] is not None
    # the same two steps with the lm_head folded into the logprobs (bf16: rounding differs)
    assert result["engine_fused"]["loss"] == pytest.approx(engine["loss"], rel=1e-2)


def test_grpo_batch_runs_every_token_and_shared_prompt_variants(tmp_path):
    """--grpo builds n answers per prompt with the loss on the answers; --every-token,
    --shared-prompts and --unshared-prompts run the engine with those settings beside the default
    (--actor for all)."""
    out = tmp_path / "grpo.json"
    argv = [*SMALL[:8], "--grpo", "2", "4", "12", "8", "--max-tokens-per-mb", "64", "--skip-bare"]
    argv += ["--every-token", "--shared-prompts", "--unshared-prompts", "--actor", "fused_logprobs=true"]
    r = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_train.py"), *argv, "--workdir", str(tmp_path / "w")]
        + ["--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["seqs"] == 8 and result["len_range"] == [16, 20]
    runs = ("engine", "engine_every_token", "engine_shared_prompts", "engine_unshared_prompts")
    assert all(result[name]["median_step_s"] > 0 for name in runs)
    # one loss over the same batch, however the logits and prompts are computed
    losses = [result[name]["loss"] for name in runs]
    assert max(losses) - min(losses) < 1e-4 * abs(losses[0])
    # shared: each prompt once for its 4 answers, 2 x 12 prompt tokens computed instead of 8 x 12
    # (on CPU the default, auto, computes each sequence whole)
    real = result["engine"]["real_tokens"]
    assert result["engine_shared_prompts"]["computed_tokens"] == real - 6 * 12
    whole = [result[name]["computed_tokens"] for name in ("engine", "engine_every_token", "engine_unshared_prompts")]
    assert whole == [real] * 3
