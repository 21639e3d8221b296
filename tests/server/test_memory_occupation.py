"""/release_memory_occupation and /resume_memory_occupation on a real server process (CPU: the
bookkeeping and the refusals are those of CUDA; tests/server/gpu has the device-memory readings),
and the KV budget (--max-total-tokens here; --mem-fraction-static computes it otherwise)."""

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.server.helpers import prompt_ids

torch = pytest.importorskip("torch")

from areal.utils.tensor_ipc import serialize_named_tensors  # noqa: E402 (after importorskip, as it imports torch)

PROMPT = prompt_ids(21, 6)
N_NEW = 16
BUDGET = 500  # KV tokens: two requests of 6 + 194 fit (400), three (600) do not
RELEASE, RESUME = "/release_memory_occupation", "/resume_memory_occupation"


@pytest.fixture(scope="module")
def server(varied_model_dir):
    from tests.serving import start_server

    handle = start_server(
        varied_model_dir, extra_args=["--dtype", "float32", "--max-total-tokens", BUDGET, "--enable-memory-saver"]
    )
    yield handle
    assert handle.stop() == 0, handle.log()


def post(server, path, body=None, timeout=120):
    return requests.post(server.url + path, json=body, timeout=timeout)


def ok(r) -> dict:
    assert r.status_code == 200, r.text
    return r.json()


def generate(server, prompt=PROMPT, max_new=N_NEW):
    return post(
        server,
        "/generate",
        {
            "input_ids": prompt,
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True},
        },
        timeout=300,
    )


def greedy(server):
    out = ok(generate(server))
    return out["output_ids"], [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]


def info(server) -> dict:
    return requests.get(server.url + "/get_server_info", timeout=30).json()


def model_picks(model, prompt, output_ids):
    """The model's greedy pick after each prefix of `output_ids` (one full forward): equal to
    `output_ids` exactly when they are its greedy continuation of `prompt`."""
    ids = torch.tensor([prompt + output_ids])
    with torch.no_grad():
        return model(ids).logits[0, len(prompt) - 1 : -1].argmax(-1).tolist()


def test_greedy_output_is_unchanged_by_release_and_resume(server):
    before = greedy(server)
    reply = ok(post(server, RELEASE, {"tags": None}))
    assert reply["changed"] == ["kv_cache", "weights"] == reply["released"]
    memory = info(server)["memory"]
    assert memory["released"] == ["kv_cache", "weights"]
    assert memory["offloaded_weights_bytes"] > 0 and memory["rss_bytes"] > 0
    r = generate(server)
    assert r.status_code == 400
    assert "/resume_memory_occupation" in r.json()["error"]["message"]
    assert requests.get(server.url + "/health").status_code == 200
    assert requests.get(server.url + "/health_generate").status_code == 200
    assert ok(post(server, RESUME))["released"] == []  # no body: both tags
    assert info(server)["memory"]["offloaded_weights_bytes"] == 0
    assert greedy(server) == before  # token ids and logprobs, exactly


def test_tags_release_and_resume_exactly_what_they_name(server):
    before = greedy(server)
    assert ok(post(server, RELEASE, {"tags": ["kv_cache"]}))["released"] == ["kv_cache"]
    message = generate(server).json()["error"]["message"]
    assert "kv_cache memory is released" in message and "/resume_memory_occupation" in message
    reply = ok(requests.get(server.url + RELEASE, json={"tags": ["weights", "kv_cache"]}))
    assert reply["changed"] == ["weights"] and reply["released"] == ["kv_cache", "weights"]
    assert "kv_cache already released" in reply["message"]
    reply = ok(post(server, RESUME, {"tags": ["kv_cache"]}))
    assert reply["changed"] == ["kv_cache"] and reply["released"] == ["weights"]
    assert "weights memory is released" in generate(server).json()["error"]["message"]
    reply = ok(post(server, RESUME, {"tags": ["weights"]}))
    assert reply["released"] == []
    # [] means all, as in SGLang, and nothing is released: SGLang's scheduler would exit (KeyError)
    r = post(server, RESUME, {"tags": []})
    assert r.status_code == 400 and "kv_cache, weights are not released" in r.json()["error"]["message"]
    assert ok(post(server, RELEASE, {"tags": ["weights"]}))["released"] == ["weights"]
    r = post(server, RESUME, {"tags": ["kv_cache", "weights"]})  # refused whole: weights stay released
    assert r.status_code == 400 and "kv_cache is not released (released: ['weights'])" in r.json()["error"]["message"]
    assert ok(post(server, RESUME, {"tags": ["weights"]}))["released"] == []
    assert greedy(server) == before


@pytest.mark.parametrize(
    "body, needle",
    [
        ({"tags": ["cuda_graph"]}, ("unknown tag(s) ['cuda_graph']; valid tags are ['kv_cache', 'weights']")),
        ({"tags": "weights"}, "'tags' must be null or a list of strings"),
        ({"tag": ["weights"]}, "unknown key(s) ['tag']"),
    ],
)
def test_bad_tags_are_400_naming_the_valid_ones(server, body, needle):
    for route in (RELEASE, RESUME):
        r = post(server, route, body)
        assert r.status_code == 400 and needle in r.json()["error"]["message"]
    assert info(server)["memory"]["released"] == []


def wait_for(predicate, what, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def pause_while_generating(server, start, mode="in_place", attempts=5):
    """Pause `mode` while the one request `start()` sends is generating; returns its future.
    A request that finished before the pause landed is not an error: it is sent again."""
    for _ in range(attempts):
        future = start()
        wait_for(lambda f=future: info(server)["load"]["running"] == 1 or f.done(), "the request to start")
        if ok(post(server, "/pause_generation", {"mode": mode}))["requests_held"] == 1:
            return future
        ok(post(server, "/continue_generation", {}))
        future.result(timeout=300)
    raise AssertionError(f"no pause caught the request in {attempts} attempts")


def test_release_needs_requests_paused_without_their_cache(server):
    """Release needs an idle server, as in SGLang (which asserts): a request held in place or by
    retract is a 400 naming the fix; paused with abort, the request comes back with the tokens
    so far (the client resubmits the rest) and release works."""
    long_prompt = prompt_ids(22, 5)
    reference = ok(generate(server, long_prompt, 490))["output_ids"]
    with ThreadPoolExecutor(1) as pool:
        future = pause_while_generating(server, lambda: pool.submit(generate, server, long_prompt, 490))
        r = post(server, RELEASE)
        message = r.json()["error"]["message"]
        assert r.status_code == 400 and "1 request(s) are running" in message
        assert "in_place" in message and "/pause_generation" in message and "'abort'" in message
        assert info(server)["memory"]["released"] == []
        ok(post(server, "/pause_generation", {"mode": "retract"}))  # drops the cache, still queued
        r = post(server, RELEASE)
        assert (
            r.status_code == 400 and "1 queued (held by /pause_generation mode retract)" in r.json()["error"]["message"]
        )
        ok(post(server, "/pause_generation", {"mode": "abort"}))
        out = future.result(timeout=300)
        assert ok(post(server, RELEASE))["released"] == ["kv_cache", "weights"]
        ok(post(server, RESUME))
        ok(post(server, "/continue_generation", {}))
    assert out.status_code == 200, out.text
    assert out.json()["meta_info"]["finish_reason"]["type"] == "abort"
    partial = out.json()["output_ids"]
    assert 0 < len(partial) < 490 and partial == reference[: len(partial)]


def test_weight_update_while_released_is_served_after_resume(server, varied_model_dir):
    """Updates write into the CPU copies of released weights; resume brings them back."""
    from transformers import AutoModelForCausalLM

    original = AutoModelForCausalLM.from_pretrained(varied_model_dir, dtype="float32").eval()
    other = AutoModelForCausalLM.from_pretrained(varied_model_dir, dtype="float32").eval()
    with torch.no_grad():
        for param in other.parameters():
            param.mul_(-1.0)
    before = ok(generate(server))["output_ids"]
    ok(post(server, RELEASE, {"tags": ["weights"]}))
    try:
        payload = serialize_named_tensors(list(other.state_dict().items()))
        reply = ok(
            post(
                server, "/update_weights_from_tensor", {"serialized_named_tensors": [payload], "weight_version": "neg"}
            )
        )
        assert reply["success"]
        r = post(server, "/load_lora_adapter", {"lora_name": "a", "lora_path": varied_model_dir})
        assert r.status_code == 400 and "/resume_memory_occupation" in r.json()["message"]
    finally:
        ok(post(server, RESUME, {"tags": ["weights"]}))
    out = ok(generate(server))
    assert out["meta_info"]["weight_version"] == "neg"
    assert out["output_ids"] == model_picks(other, PROMPT, out["output_ids"]) != before
    payload = serialize_named_tensors(list(original.state_dict().items()))
    ok(
        post(
            server, "/update_weights_from_tensor", {"serialized_named_tensors": [payload], "weight_version": "default"}
        )
    )
    assert ok(generate(server))["output_ids"] == before


def test_kv_budget_admits_what_fits_and_refuses_what_never_can(server, ref_model):
    """Three requests of 200 KV tokens each against a budget of 500: two run together, the third
    waits for one of them to finish; all three get their own greedy output. One request of 506
    tokens can never fit: a 400 naming the flag."""
    server_info = info(server)
    assert server_info["max_total_num_tokens"] == BUDGET
    assert server_info["kv_budget"]["limited_by"] == "--max-total-tokens"
    before = server_info["batching"]
    prompts = [prompt_ids(30 + i, 6) for i in range(3)]
    # held at the gate while paused, the three are submitted together on continue
    ok(post(server, "/pause_generation", {"mode": "in_place"}))
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(generate, server, p, 194) for p in prompts]
        wait_for(lambda: info(server)["load"]["accepted"] == 3, "the requests to arrive")
        ok(post(server, "/continue_generation", {}))
        outs = [ok(f.result(timeout=300))["output_ids"] for f in futures]
    for prompt, out in zip(prompts, outs):
        assert len(out) == 194 and out == model_picks(ref_model, prompt, out)
    stats = info(server)["batching"]
    assert stats["requests_served"] == before["requests_served"] + 3
    assert stats["max_batch_size"] == 2  # never three: 600 tokens would not fit
    assert 2 * 200 <= stats["max_kv_tokens_reserved"] <= BUDGET
    assert stats["kv_budget_waits"] > before["kv_budget_waits"]  # the third one waited
    r = generate(server, PROMPT, 500)
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "needs 506 KV cache tokens" in message and "max_total_num_tokens 500" in message
    assert "--max-total-tokens" in message and "--mem-fraction-static" in message


@pytest.mark.parametrize(
    "flags, code, needle",
    [
        (["--mem-fraction-static", "1.5"], 2, "--mem-fraction-static 1.5 is invalid"),
        (["--max-total-tokens", "0"], 2, "--max-total-tokens 0 is invalid"),
        (["--mem-fraction-static", "1e-9"], 1, "--mem-fraction-static 1e-09: "),
    ],
)
def test_memory_flag_errors(varied_model_dir, flags, code, needle):
    proc = subprocess.run(
        [sys.executable, "-m", "areal.server", "--model-path", varied_model_dir, *flags],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == code and needle in proc.stderr, proc.stderr
