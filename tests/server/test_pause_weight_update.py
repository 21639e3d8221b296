"""A real weight change while requests are held (pause in_place or retract): the tokens after
the update must be what each mode promises. retract re-prefills under the new weights, so the
rest of the answer is the new model's alone; in_place keeps the KV cache the old weights
computed, so the new weights continue from the old keys and values. The reference for both is
transformers with an explicit cache, compared token by token and logprob by logprob."""

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.server.helpers import prompt_ids
from tests.serving import pause_mid_generation

N_NEW = 200
MIN_AFTER = 50  # tokens after the switch, enough to tell the modes apart
PROMPTS = [prompt_ids(200 + i, 5) for i in range(3)]


@pytest.fixture(scope="module")
def weight_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("weights")


@pytest.fixture(scope="module")
def new_model_dir(weight_dir):
    from tests.serving import make_varied_model_dir

    return str(make_varied_model_dir(weight_dir / "new", seed=1))


@pytest.fixture(scope="module")
def models(varied_model_dir, new_model_dir):
    from transformers import AutoModelForCausalLM

    return [AutoModelForCausalLM.from_pretrained(d, dtype="float32").eval() for d in (varied_model_dir, new_model_dir)]


@pytest.fixture
def server(varied_model_dir, weight_dir):
    from tests.serving import start_server

    handle = start_server(varied_model_dir, extra_args=["--dtype", "float32", "--weight-dirs", str(weight_dir)])
    yield handle
    assert handle.stop() == 0, handle.log()


def post(server, path, body, timeout=120):
    r = requests.post(server.url + path, json=body, timeout=timeout)
    assert r.status_code == 200, r.text
    return r.json()


def generate(server, prompt):
    return post(
        server,
        "/generate",
        {
            "input_ids": prompt,
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": N_NEW, "temperature": 0, "ignore_eos": True},
        },
        timeout=300,
    )


def update_held_and_continue(server, model_dir):
    """Load `model_dir` as version "new" while requests are held (no flush, no abort), then go on."""
    post(
        server,
        "/update_weights_from_disk",
        {"model_path": model_dir, "abort_all_requests": False, "flush_cache": False},
    )
    post(server, "/update_weight_version", {"new_version": "new", "abort_all_requests": False})
    post(server, "/continue_generation", {})


def generated_tokens(server):
    return requests.get(server.url + "/server_info").json()["batching"]["generated_tokens"]


def reference_logprobs(models, prompt, output, switch, mode):
    """Logprobs of output[switch:] as the mode defines them. The pause stopped each request
    after sampling output[switch - 1]; that token's keys and values, and all later ones, come
    from the new weights either way. Before it: the new weights too (retract), or the old
    weights' cache (in_place)."""
    import torch
    from transformers import DynamicCache

    old, new = models
    start = len(prompt) + switch - 1  # positions before this one were cached before the pause
    with torch.no_grad():
        if mode == "retract":
            logits = new(torch.tensor([prompt + output])).logits[0, start:-1]
        else:
            cache = DynamicCache()
            old(torch.tensor([(prompt + output)[:start]]), past_key_values=cache, use_cache=True)
            rest = torch.tensor([output[switch - 1 : -1]])
            positions = torch.arange(start, start + rest.shape[1]).unsqueeze(0)
            logits = new(rest, past_key_values=cache, position_ids=positions, use_cache=True).logits[0]
    logprobs = torch.log_softmax(logits.float(), -1)
    target = torch.tensor(output[switch:])
    return logprobs.gather(1, target[:, None])[:, 0], logprobs.argmax(-1)


@pytest.mark.parametrize("mode", ["in_place", "retract"])
def test_tokens_after_a_held_update_follow_the_modes_definition(server, models, new_model_dir, mode):
    import torch

    at_start = []

    def early():  # at most N_NEW - MIN_AFTER - 1 tokens each (the other requests have one or more)
        return generated_tokens(server) - at_start[-1] - (len(PROMPTS) - 1) < N_NEW - MIN_AFTER

    with ThreadPoolExecutor(len(PROMPTS)) as pool:

        def start():
            at_start.append(generated_tokens(server))
            return [pool.submit(generate, server, p) for p in PROMPTS]

        futures, paused = pause_mid_generation(server.url, start, len(PROMPTS), mode=mode, also=early)
        assert paused["requests_held"] == len(PROMPTS)
        # SGLang refuses to flush while requests are held, and a weight update that asks for the
        # flush (its default) then asserts and takes the server down; here it is a clear 400 and
        # nothing is loaded, and the held requests are untouched
        refused = requests.post(
            server.url + "/update_weights_from_disk", json={"model_path": new_model_dir}, timeout=120
        )
        assert refused.status_code == 400 and not refused.json()["success"], refused.text
        assert "pending requests" in refused.json()["message"] and "flush_cache=false" in refused.json()["message"]
        flush = requests.post(server.url + "/flush_cache", timeout=60)
        assert flush.status_code == 400 and f"#running-req: {len(PROMPTS) if mode == 'in_place' else 0}" in flush.text
        update_held_and_continue(server, new_model_dir)
        outs = [f.result(timeout=300) for f in futures]
    assert requests.post(server.url + "/flush_cache", timeout=60).status_code == 200  # nothing held now
    for prompt, out in zip(PROMPTS, outs):
        spans = out["meta_info"]["output_version_spans"]
        assert len(spans) == 2 and spans[1][1] == "new", spans
        switch = spans[1][0]
        assert 0 < switch < N_NEW - MIN_AFTER
        served = torch.tensor([lp[0] for lp in out["meta_info"]["output_token_logprobs"][switch:]])
        expected, greedy = reference_logprobs(models, prompt, out["output_ids"], switch, mode)
        assert greedy.tolist() == out["output_ids"][switch:]  # the server's greedy picks
        torch.testing.assert_close(served, expected, atol=1e-4, rtol=0)
        # the other mode's reference must differ, or the test could not tell the two apart
        other, _ = reference_logprobs(
            models, prompt, out["output_ids"], switch, "retract" if mode == "in_place" else "in_place"
        )
        assert (other - expected).abs().max() > 0.1


def stream(server, prompt) -> list[dict]:
    """A greedy request streamed a chunk a token: each chunk's meta_info, in order."""
    import json

    body = {
        "input_ids": prompt,
        "stream": True,
        "sampling_params": {"max_new_tokens": N_NEW, "temperature": 0, "ignore_eos": True},
    }
    metas = []
    with requests.post(server.url + "/generate", json=body, stream=True, timeout=300) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines():
            if line and line != b"data: [DONE]":
                metas.append(json.loads(line[len(b"data: ") :])["meta_info"])
    return metas


def test_streamed_chunks_name_the_version_they_were_sent_under(server, new_model_dir):
    """A streamed answer held in place through a weight update: its chunks say the weight version
    as each was sent (SGLang's meta_info.weight_version), so they change once, and a chunk sent
    under the old version holds only tokens the old weights made (output_version_spans says where
    the new ones start). Chunks sent just after the update may still carry old tokens: the label
    can lag the truth, never lead it."""
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        futures, paused = pause_mid_generation(
            server.url, lambda: [pool.submit(stream, server, p) for p in PROMPTS], len(PROMPTS)
        )
        assert paused["requests_held"] == len(PROMPTS)
        update_held_and_continue(server, new_model_dir)
        answers = [f.result(timeout=300) for f in futures]
    for metas in answers:
        assert [m["completion_tokens"] for m in metas] == list(range(1, N_NEW + 1))  # a chunk a token
        versions = [m["weight_version"] for m in metas]
        assert versions[0] == "default" and versions[-1] == "new"
        assert sum(a != b for a, b in zip(versions, versions[1:])) == 1, versions
        spans = metas[-1]["output_version_spans"]
        assert len(spans) == 2 and spans[1][1] == "new", spans
        labelled_old = max(m["completion_tokens"] for m in metas if m["weight_version"] == "default")
        assert 0 < labelled_old <= spans[1][0] < N_NEW, (labelled_old, spans)
