"""actor.lora_push=adapter end to end: a LoRA FSDPEngine pushes peft adapters to a running
built-in server through RemoteSGLangEngine, whose requests then name the adapter (lora_path)."""

import asyncio

import requests
import torch

from tests.engine.test_fsdp_helpers import make_batch, nll_loss, token_weight, trainer_and_server


def _generate(client, prompt, n=8):
    from areal.api.inference import ModelRequest

    return asyncio.run(client.agenerate(ModelRequest(input_ids=prompt, max_new_tokens=n, temperature=0.0)))


def _trainer_logprobs(engine, prompt, ids):
    full = torch.tensor([prompt + ids])
    lp = engine.forward({"input_ids": full, "attention_mask": torch.ones_like(full)})
    return lp[0, len(prompt) :]


def test_adapter_push_serves_the_trained_adapter(tmp_path_factory):
    from areal.api.weights import WeightUpdateMeta
    from areal.trainer.sources import push_to_control
    from tests.serving import make_varied_model_dir

    model_dir = str(make_varied_model_dir(tmp_path_factory.mktemp("varied") / "m", scale=4.0))
    with trainer_and_server(
        model_dir,
        tmp_path_factory.mktemp("fileroot"),
        learning_rate=3e-2,
        use_lora=True,
        lora_rank=4,
        lora_alpha=8,
        lora_push="adapter",
        max_tokens_per_mb=40,
        experiment_name="lora",
        trial_name="t",
    ) as (server, engine, client):
        batch = make_batch(3)
        for _ in range(3):
            engine.train_batch(batch, nll_loss, token_weight)
        prompt = [1, 5, 6, 7, 8]

        base = _generate(client, prompt)  # before any push: the base model, no lora_path
        assert (
            _trainer_logprobs(engine, prompt, base.output_tokens) - torch.tensor(base.output_logprobs)
        ).abs().max() > 1e-3  # training moved it

        stats = push_to_control(engine, WeightUpdateMeta(type="disk", version=1), client.control)
        assert stats["weight_update/bytes"] > 0
        out = _generate(client, prompt)
        diff = _trainer_logprobs(engine, prompt, out.output_tokens) - torch.tensor(out.output_logprobs)
        assert diff.abs().max() < 1e-4
        assert out.output_versions == [1] * len(out.output_tokens)

        engine.train_batch(batch, nll_loss, token_weight)
        push_to_control(engine, WeightUpdateMeta(type="disk", version=2), client.control)  # v1 unloaded
        out = _generate(client, prompt)
        diff = _trainer_logprobs(engine, prompt, out.output_tokens) - torch.tensor(out.output_logprobs)
        assert diff.abs().max() < 1e-4
        assert set(out.output_versions) == {2}
        assert requests.get(server.url + "/model_info", timeout=10).json()["weight_version"] == "2"

        r = requests.post(
            server.url + "/generate",
            timeout=30,
            json={"input_ids": prompt, "sampling_params": {"max_new_tokens": 2}, "lora_path": "v1"},
        )
        assert r.status_code == 400  # the trainer unloaded the previous adapter
        assert "'v1' is not loaded" in r.json()["error"]["message"]
        assert "['v2']" in r.json()["error"]["message"]
