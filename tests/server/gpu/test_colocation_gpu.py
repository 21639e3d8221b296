"""Colocation on one GPU (skipped without CUDA; run through the device tool): this test process
plays the trainer next to a built-in server on the same device. Weights travel as CUDA IPC handles
(/update_weights_from_tensor), and /release_memory_occupation really gives the device memory back
(read from the server's own torch.cuda counters in /get_server_info "memory")."""

from __future__ import annotations

import pytest
import requests
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PROMPT = [1, 7, 12, 5, 30, 9]
N_NEW = 24


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.serving import make_varied_model_dir

    # ~170 MB of float32 weights: far above the allocator's block sizes, so the drop is clear
    return str(
        make_varied_model_dir(
            tmp_path_factory.mktemp("coloc") / "model",
            hidden_size=1024,
            num_layers=4,
            num_heads=8,
            num_kv_heads=2,
            scale=4.0,
        )
    )


@pytest.fixture(scope="module")
def server(model_dir):
    from tests.serving import start_server

    handle = start_server(
        model_dir,
        extra_args=["--device", "cuda", "--dtype", "float32", "--mem-fraction-static", "0.3", "--enable-memory-saver"],
        timeout=300,
    )
    yield handle
    assert handle.stop() == 0, handle.log()[-3000:]


def post(server, path, body=None):
    return requests.post(server.url + path, json=body, timeout=300)


def generate(server):
    r = post(
        server,
        "/generate",
        {
            "input_ids": PROMPT,
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": N_NEW, "temperature": 0, "ignore_eos": True},
        },
    )
    assert r.status_code == 200, r.text
    out = r.json()
    return out["output_ids"], [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]], out


def memory(server) -> dict:
    return requests.get(server.url + "/get_server_info", timeout=60).json()["memory"]


def test_update_through_cuda_ipc_handles(server, model_dir):
    from transformers import AutoModelForCausalLM

    from areal.utils.tensor_ipc import serialize_named_tensors

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    gen = torch.Generator(device="cuda").manual_seed(3)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.3 * param.std() * torch.randn(param.shape, generator=gen, device="cuda"))
    before, _, _ = generate(server)
    named = list(model.state_dict().items())  # CUDA tensors: kept alive until the reply
    r = post(
        server,
        "/update_weights_from_tensor",
        {"serialized_named_tensors": [serialize_named_tensors(named)], "weight_version": "ipc1"},
    )
    assert r.status_code == 200 and r.json()["success"], r.text
    print("CUDA IPC update:", {k: v for k, v in r.json().items() if k.endswith("_s")})
    ids, served, out = generate(server)
    assert out["meta_info"]["weight_version"] == "ipc1" and ids != before
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + ids], device="cuda")).logits[0, len(PROMPT) - 1 : -1]
    lp = torch.log_softmax(logits.double(), -1)
    assert lp.argmax(-1).tolist() == ids
    expected = lp.gather(1, torch.tensor(ids, device="cuda")[:, None])[:, 0].cpu()
    gap = (torch.tensor(served, dtype=torch.float64) - expected).abs().max().item()
    print(f"CUDA IPC update: max logprob gap {gap:.2e}")
    assert gap < 1e-3  # float32 on both sides; CUDA kernels differ in summation order


def test_release_frees_device_memory_and_resume_restores_it(server):
    before_ids, before_lp, _ = generate(server)
    start = memory(server)
    info = requests.get(server.url + "/get_server_info", timeout=60).json()
    weights = info["kv_budget"]["weights_bytes"]
    print("KV budget:", info["kv_budget"])
    assert info["kv_budget"]["mem_fraction_static"] == 0.3 and info["max_total_num_tokens"] > 0
    r = post(server, "/release_memory_occupation", {"tags": None})
    assert r.status_code == 200, r.text
    released = memory(server)
    r = post(server, "/resume_memory_occupation", {"tags": None})
    assert r.status_code == 200, r.text
    resumed = memory(server)
    for key in ("allocated_bytes", "reserved_bytes"):
        print(f"{key}: start {start[key]}, released {released[key]}, resumed {resumed[key]}; weights {weights}")
    assert released["offloaded_weights_bytes"] == weights
    assert released["allocated_bytes"] < start["allocated_bytes"] - 0.9 * weights
    assert released["reserved_bytes"] < start["reserved_bytes"] - 0.9 * weights
    assert released["reserved_bytes"] < 0.1 * weights  # the device holds next to nothing
    assert resumed["allocated_bytes"] >= weights and resumed["reserved_bytes"] >= weights
    ids, lp, _ = generate(server)
    assert ids == before_ids and lp == before_lp  # the same bytes came back
