"""Shared pieces of the FSDP engine tests (no tests here): batches, a simple loss, a one-rank
engine, a plain single-process reference step, a torchrun launcher for the two-process scenarios, and a trainer
beside a built-in server it pushes weights to."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]


def make_batch(seed: int, n: int = 8, max_len: int = 16, prompt_len: int = 3, vocab=(3, 40)):
    """Right-padded batch with varied lengths; loss on every token after the prompt."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(prompt_len + 2, max_len + 1, (n,), generator=g)
    ids = torch.randint(vocab[0], vocab[1], (n, max_len), generator=g)
    pos = torch.arange(max_len)[None]
    attn = (pos < lengths[:, None]).long()
    ids = ids * attn
    loss_mask = attn * (pos >= prompt_len).long()
    return {
        "input_ids": ids,
        "attention_mask": attn,
        "loss_mask": loss_mask,
        "rewards": torch.arange(n, dtype=torch.float32),
    }


def nll_loss(logprobs, entropy, mb):
    """Token-mean negative log-likelihood of the loss tokens (an SFT loss: easy to check)."""
    mask = mb["loss_mask"].bool()
    loss = -(logprobs * mask).sum() / mask.sum().clamp(min=1)
    return loss, {"nll": loss.detach()}


def token_weight(mb) -> float:
    return float(mb["loss_mask"].sum())


def one_rank_engine(model_dir: str, **kw):
    """An initialized float32 FSDPEngine in this process (a one-rank gloo group), with small
    micro-batches and a learning rate that moves the tiny model."""
    from areal.engine.fsdp.engine import FSDPEngine

    kw.setdefault("max_tokens_per_mb", 30)
    kw.setdefault("learning_rate", 1e-3)
    return FSDPEngine.from_pretrained(model_dir, dtype="float32", **kw)


@contextlib.contextmanager
def one_torch_thread():
    """torch on one intra-op thread (tests share two cores), restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def padded_logprobs(model, batch, *, every_token: bool = False):
    """Per-token logprobs of a plain HF model on the right-padded batch (no packing), as the engine
    gives them: on the loss tokens where the batch has a loss_mask (0 elsewhere), or, with
    every_token (actor.logprobs_on_every_token), on every real token."""
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    lp = torch.log_softmax(out[:, :-1].float(), -1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    lp = torch.cat([torch.zeros_like(lp[:, :1]), lp], 1)
    keep = batch["attention_mask"] if every_token or "loss_mask" not in batch else batch["loss_mask"]
    return lp * keep


def reference_step(model_dir: str, batch, *, lr: float, clip: float = 1.0):
    """One AdamW step of a plain, unsharded fp32 model on the whole batch: the ground truth."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    loss, _ = nll_loss(padded_logprobs(model, batch), None, batch)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    return float(loss), float(norm), {k: v.detach().clone() for k, v in model.state_dict().items()}


def run_torchrun(args: list[str], out_dir: Path, nproc: int = 2, timeout: int = 300, env=None) -> dict:
    """Run tests/engine/test_fsdp_distributed.py's scenario main under torchrun; returns rank 0's JSON."""
    out_dir.mkdir(parents=True, exist_ok=True)
    log = out_dir / "torchrun.log"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--master-port",
        str(_free_port()),
        "-m",
        "tests.engine.test_fsdp_distributed",
        "--out",
        str(out_dir),
        *args,
    ]
    full_env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONFAULTHANDLER": "1",  # a rank that aborts prints every thread's Python stack
        "PYTHONPATH": str(REPO),
        **(env or {}),
    }
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env=full_env, timeout=timeout)
    if proc.returncode != 0:
        text = log.read_text()
        errors = [line for line in text.splitlines() if line.startswith("[rank0]: ") and "Error" in line]
        raise RuntimeError(
            f"torchrun {' '.join(args)} failed ({proc.returncode}); rank 0: {errors[-1:]}\n{text[-6000:]}"
        )
    return json.loads((out_dir / "result.json").read_text())


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def trainer_and_server(model_dir: str, fileroot: Path, **engine_kwargs):
    """(server, engine, client): a built-in server of `model_dir` that may load weight updates
    under `fileroot`, an FSDPEngine of the same model saving there, and a RemoteSGLangEngine of
    the server; all stopped on exit."""
    from areal.config import ExperimentConfig
    from areal.engine.fsdp.engine import FSDPEngine
    from areal.engine.sglang.client import RemoteSGLangEngine
    from tests.serving import start_server

    server = start_server(
        model_dir,
        extra_args=["--device", "cpu", "--dtype", "float32", "--weight-dirs", str(fileroot)],
        env={"OMP_NUM_THREADS": "1"},
    )
    engine = client = None
    try:
        engine = FSDPEngine.from_pretrained(model_dir, dtype="float32", fileroot=str(fileroot), **engine_kwargs)
        cfg = ExperimentConfig.model_validate({"rollout": {"server_addrs": [server.url], "request_timeout_s": 60}})
        client = RemoteSGLangEngine(cfg)
        client.initialize()
        yield server, engine, client
    finally:
        if client is not None:
            client.destroy()
        if engine is not None:
            engine.destroy()
        server.stop()
