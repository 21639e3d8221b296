"""/load_lora_adapter and /unload_lora_adapter on the built-in server (see areal/server/lora.py):
merged serving checked against a reference model, lora_path checks, allowed folders, and loads
that merge from the base weights rather than on top of each other."""

import copy
import json

import requests
import torch

PROMPT = [1, 5, 6, 7, 8, 9]
TARGETS = ("model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj")


def make_adapter(folder, ref_model, seed, r=2, alpha=4):
    """A peft-format adapter folder with random A and B; returns {param name: delta}."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    modules = dict(ref_model.named_modules())
    tensors, deltas = {}, {}
    for name in TARGETS:
        out_f, in_f = modules[name].weight.shape
        a = torch.randn(r, in_f, generator=gen) * 0.5
        b = torch.randn(out_f, r, generator=gen) * 0.5
        tensors[f"base_model.model.{name}.lora_A.weight"] = a
        tensors[f"base_model.model.{name}.lora_B.weight"] = b
        deltas[name + ".weight"] = (alpha / r) * b @ a
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    (folder / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": r, "lora_alpha": alpha, "target_modules": ["q_proj", "down_proj"]})
    )
    return str(folder), deltas


def merged(ref_model, deltas):
    model = copy.deepcopy(ref_model)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, delta in deltas.items():
            params[name].add_(delta)
    return model


def generate(server, lora_path=None, n=8):
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": n, "temperature": 0.0}, "return_logprob": True}
    if lora_path is not None:
        body["lora_path"] = lora_path
    return requests.post(server.url + "/generate", json=body, timeout=60)


def max_diff(model, reply):
    out = reply.json()["meta_info"]["output_token_logprobs"]
    ids = [tid for _, tid, _ in out]
    full = torch.tensor([PROMPT + ids])
    with torch.no_grad():
        logits = model(full).logits[0, len(PROMPT) - 1 : -1].float()
    ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]
    return float((ref - torch.tensor([lp for lp, _, _ in out])).abs().max())


def post(server, path, body):
    return requests.post(server.url + path, json=body, timeout=60)


def test_adapters_load_serve_merged_and_unload(server, ref_model, allowed_dir):
    path1, deltas1 = make_adapter(allowed_dir / "a1", ref_model, seed=1)
    path2, deltas2 = make_adapter(allowed_dir / "a2", ref_model, seed=2)
    assert max_diff(ref_model, generate(server)) < 1e-4  # base before any adapter

    r = post(server, "/load_lora_adapter", {"lora_name": "v1", "lora_path": path1})
    assert r.status_code == 200 and r.json()["success"], r.text
    assert r.json()["loaded_adapters"] == {"v1": path1}
    reply = generate(server, "v1")
    assert reply.status_code == 200, reply.text
    assert max_diff(merged(ref_model, deltas1), reply) < 1e-4
    assert max_diff(ref_model, reply) > 1e-3  # the adapter changed what is served

    # a second load merges into the base, not on top of v1; v1 stays listed but is not served
    r = post(server, "/load_lora_adapter", {"lora_name": "v2", "lora_path": path2})
    assert r.json()["loaded_adapters"] == {"v1": path1, "v2": path2}
    assert max_diff(merged(ref_model, deltas2), generate(server, "v2")) < 1e-4
    r = generate(server, "v1")
    assert r.status_code == 400 and "no longer served" in r.json()["error"]["message"]

    r = post(server, "/unload_lora_adapter", {"lora_name": "v1"})
    assert r.status_code == 200 and r.json()["loaded_adapters"] == {"v2": path2}
    r = generate(server, "nope")
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "'nope' is not loaded" in message and "['v2']" in message

    r = post(server, "/unload_lora_adapter", {"lora_name": "v2"})
    assert r.status_code == 200 and r.json()["loaded_adapters"] == {}
    assert max_diff(ref_model, generate(server)) < 1e-4  # unloading the served one restores the base
    r = post(server, "/unload_lora_adapter", {"lora_name": "v2"})
    assert r.status_code == 400 and not r.json()["success"]


def test_adapter_outside_weight_dirs_is_refused(server, ref_model, tmp_path):
    path, _ = make_adapter(tmp_path / "outside", ref_model, seed=3)
    r = post(server, "/load_lora_adapter", {"lora_name": "x", "lora_path": path})
    assert r.status_code == 403 and not r.json()["success"]
    assert "lora_path" in r.json()["error_message"] and "--weight-dirs" in r.json()["error_message"]


def test_bad_adapter_requests_are_400(server, allowed_dir):
    r = post(server, "/load_lora_adapter", {"lora_name": "x"})
    assert r.status_code == 400 and "required" in r.json()["error"]["message"]
    r = post(server, "/load_lora_adapter", {"lora_name": "x", "lora_path": str(allowed_dir / "missing")})
    assert r.status_code == 400 and "adapter_config.json" in r.json()["error_message"]
    r = post(server, "/unload_lora_adapter", {"lora_name": "x", "typo": 1})
    assert r.status_code == 400 and "typo" in r.json()["error"]["message"]
