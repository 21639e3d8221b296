"""One GPU shared by the trainer and a built-in server (skipped without CUDA; run through the
device tool):

    python -m pytest -q -m gpu tests/engine/gpu/test_colocated_gpu.py -s

* FSDPEngine.offload() really frees the trainer's device memory and onload() brings it back, and
  training goes on as if nothing happened;
* a train state loaded while offloaded (a recovered time-shared run) trains after onload(): the
  fused AdamW's step counts come back to the device with the rest;
* a tensor weight update (CUDA IPC handles) from the trainer to a server on the same GPU: the
  server's logprobs then match the trainer's.
"""

from __future__ import annotations

import pytest
import torch
from model_shapes import make_batch

from tests.engine.gpu.conftest import nll as _nll
from tests.engine.gpu.conftest import token_weight as _weight

pytestmark = pytest.mark.gpu


def test_offload_frees_the_trainers_memory_and_training_goes_on(qwen_05b):
    from areal.engine.fsdp.engine import FSDPEngine

    model_dir, tok_dir = qwen_05b
    batch = make_batch(8, 64, 512, vocab=151936)
    engine = FSDPEngine.from_pretrained(
        model_dir, tokenizer_path=tok_dir, dtype="bfloat16", learning_rate=1e-4, max_tokens_per_mb=4096
    )
    try:
        first = engine.train_batch(batch, _nll, _weight)  # optimizer state exists from here on
        resident = torch.cuda.memory_allocated()
        engine.offload()
        offloaded = torch.cuda.memory_allocated()
        assert all(p.device.type == "cpu" for p in engine.model.parameters())
        engine.onload()
        assert torch.cuda.memory_allocated() >= resident * 0.95
        second = engine.train_batch(batch, _nll, _weight)
    finally:
        engine.destroy()
    n_params = sum(p.numel() for p in engine_params(model_dir))
    print(
        f"offload: {resident / 2**30:.2f} GiB resident -> {offloaded / 2**30:.2f} GiB offloaded "
        f"({n_params / 1e6:.0f}M parameters)"
    )
    # fp32 weights + Adam's two moments: at least 12 bytes per parameter left the device
    assert resident - offloaded >= 12 * n_params * 0.9
    assert second["loss"] < first["loss"]


def test_train_state_loaded_while_offloaded_trains_after_onload(tiny_model_dir, tmp_path):
    from transformers import AutoConfig

    from areal.engine.fsdp.engine import FSDPEngine

    batch = make_batch(4, 8, 24, vocab=AutoConfig.from_pretrained(tiny_model_dir).vocab_size)
    engine = FSDPEngine.from_pretrained(tiny_model_dir, dtype="bfloat16", learning_rate=1e-3, max_tokens_per_mb=256)
    try:
        assert any(g.get("fused") for g in engine.optimizer.param_groups)  # CUDA: fused AdamW
        first = engine.train_batch(batch, _nll, _weight)
        engine.save_train_state(str(tmp_path / "state"))
        engine.offload()
        engine.load_train_state(str(tmp_path / "state"))  # as a relaunch does before its first step
        engine.onload()
        steps = [s["step"] for s in engine.optimizer.state.values()]
        assert steps and all(t.device.type == "cuda" for t in steps)
        second = engine.train_batch(batch, _nll, _weight)  # before the fix: "state_steps is on cpu"
    finally:
        engine.destroy()
    assert second["loss"] < first["loss"]


def engine_params(model_dir):
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        return list(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir)).parameters())


def test_tensor_update_to_a_server_on_the_same_gpu(qwen_05b):
    import requests

    from areal.api.weights import WeightUpdateMeta
    from areal.engine.fsdp.engine import FSDPEngine
    from areal.engine.sglang.control import ServerControl
    from areal.trainer.sources import push_to_control
    from tests.serving import start_server

    model_dir, tok_dir = qwen_05b
    server = start_server(
        model_dir, extra_args=["--dtype", "bfloat16", "--skip-tokenizer-init", "--mem-fraction-static", "0.3"]
    )
    engine = FSDPEngine.from_pretrained(model_dir, tokenizer_path=tok_dir, dtype="bfloat16", trainable=False)
    try:
        control = ServerControl([server.url], pause_mode="abort")
        from torch.distributed.tensor import DTensor

        with torch.no_grad():
            for p in engine.model.parameters():
                local = p.to_local() if isinstance(p, DTensor) else p.data
                local.add_(torch.randn_like(local) * 0.02)
        stats = push_to_control(engine, WeightUpdateMeta(type="tensor", version=1), control)
        prompt = list(range(5, 21))
        out = requests.post(
            server.url + "/generate",
            json={
                "input_ids": prompt,
                "return_logprob": True,
                "sampling_params": {"temperature": 0.0, "max_new_tokens": 16, "ignore_eos": True},
            },
            timeout=120,
        ).json()
        ids = torch.tensor([prompt + out["output_ids"]])
        mine = engine.forward({"input_ids": ids, "attention_mask": torch.ones_like(ids)})[0, len(prompt) :]
        theirs = torch.tensor([t[0] for t in out["meta_info"]["output_token_logprobs"]])
    finally:
        engine.destroy()
        server.stop()
    print(
        f"tensor update 0.5B on one GPU: {stats['weight_update/seconds']:.3f} s, "
        f"{stats['weight_update/bytes'] / 1e9:.2f} GB"
    )
    assert out["meta_info"]["weight_version"] == "1"
    assert (mine.cpu().float() - theirs).abs().mean() < 0.1  # bf16 on both sides, different kernels
