"""/generate against a real server subprocess: greedy equality, logprobs, batching, stops,
request validation and abort."""

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.server.helpers import hf_greedy, prompt_ids
from tests.serving import pause_mid_generation, server_load, wait_for


@pytest.fixture(scope="module")
def server(varied_model_dir):
    from tests.serving import start_server

    handle = start_server(varied_model_dir, extra_args=["--dtype", "float32", "--max-running-requests", "16"])
    yield handle
    assert handle.stop() == 0, handle.log()


def generate(server, **body):
    r = requests.post(server.url + "/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_greedy_batched_matches_transformers(server, ref_model):
    prompts = [prompt_ids(i, 3 + 2 * i) for i in range(8)]
    lengths = [24 + 3 * i for i in range(8)]  # different lengths: rows retire mid-batch
    # held at the gate until all eight are in, then let go at once: they overlap in the server
    # however the client threads happen to be scheduled
    assert requests.post(server.url + "/pause_generation", json={"mode": "in_place"}).ok
    with ThreadPoolExecutor(8) as pool:
        futures = [
            pool.submit(generate, server, input_ids=p, sampling_params={"max_new_tokens": n, "temperature": 0.0})
            for p, n in zip(prompts, lengths)
        ]
        try:
            wait_for(
                lambda: server_load(server.url)["accepted"] == len(prompts),
                lambda: f"all requests in the server: {server_load(server.url)}",
            )
        finally:
            assert requests.post(server.url + "/continue_generation", json={}).ok
        outs = [f.result() for f in futures]
    for prompt, n, out in zip(prompts, lengths, outs):
        assert out["output_ids"] == hf_greedy(ref_model, prompt, n)
    stats = requests.get(server.url + "/get_server_info").json()["batching"]
    assert stats["max_batch_size"] > 1, stats
    assert stats["mean_batch_size"] > 1, stats


def test_top_k_one_is_greedy(server, ref_model):
    prompt = prompt_ids(42, 6)
    out = generate(server, input_ids=prompt, sampling_params={"max_new_tokens": 16, "top_k": 1, "temperature": 0.8})
    assert out["output_ids"] == hf_greedy(ref_model, prompt, 16)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_logprobs_are_the_models(server, ref_model, temperature):
    import torch

    prompt = prompt_ids(7, 5)
    out = generate(
        server,
        input_ids=prompt,
        return_logprob=True,
        sampling_params={"max_new_tokens": 12, "temperature": temperature, "ignore_eos": True},
    )
    triples = out["meta_info"]["output_token_logprobs"]
    assert [t[1] for t in triples] == out["output_ids"]
    assert all(t[2] is None for t in triples)
    full = torch.tensor([prompt + out["output_ids"]])
    with torch.no_grad():
        logits = ref_model(full).logits[0, len(prompt) - 1 : -1].float()
    scale = temperature if temperature > 0 else 1.0  # greedy reports the raw distribution
    expected = torch.log_softmax(logits / scale, -1).gather(1, torch.tensor(out["output_ids"]).unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(torch.tensor([t[0] for t in triples]), expected, atol=1e-4, rtol=1e-4)


def test_text_input_meta_info_and_stops(server, ref_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(server_model_path(server))
    ids = tok("abc", add_special_tokens=False).input_ids
    by_text = generate(server, text="abc", sampling_params={"max_new_tokens": 10, "temperature": 0})
    by_ids = generate(server, input_ids=ids, sampling_params={"max_new_tokens": 10, "temperature": 0})
    assert by_text["output_ids"] == by_ids["output_ids"]
    meta = by_text["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 10}
    assert meta["prompt_tokens"] == len(ids) and meta["completion_tokens"] == 10
    assert meta["weight_version"] == "default" and meta["e2e_latency"] > 0 and meta["id"]
    full = by_ids["output_ids"]
    # stop token: kept in output_ids, dropped from text (unless no_stop_trim)
    stop_tok = full[4]
    first = full.index(stop_tok)
    out = generate(
        server, input_ids=ids, sampling_params={"max_new_tokens": 10, "temperature": 0, "stop_token_ids": [stop_tok]}
    )
    assert out["output_ids"] == full[: first + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_tok}
    assert out["text"] == tok.decode(full[:first])
    kept = generate(
        server,
        input_ids=ids,
        sampling_params={"max_new_tokens": 10, "temperature": 0, "stop_token_ids": [stop_tok], "no_stop_trim": True},
    )
    assert kept["text"] == tok.decode(full[: first + 1])
    # stop string: trimmed from text
    stop_str = tok.decode(full[5:7])
    out = generate(server, input_ids=ids, sampling_params={"max_new_tokens": 10, "temperature": 0, "stop": stop_str})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_str}
    assert stop_str not in out["text"] and tok.decode(full).startswith(out["text"])


def test_min_new_tokens_and_ignore_eos(server):
    eos = 2
    for params in ({"min_new_tokens": 20}, {"ignore_eos": True}):
        out = generate(
            server,
            input_ids=prompt_ids(3, 4),
            sampling_params={"max_new_tokens": 20, "temperature": 1.0, "stop_token_ids": list(range(3, 20)), **params},
        )
        body = out["output_ids"]
        if "min_new_tokens" in params:  # stop tokens are masked until 20 tokens exist
            assert len(body) == 20 and not set(body) & ({eos} | set(range(3, 20)))
        else:
            assert len(body) == 20


def server_model_path(server):
    return requests.get(server.url + "/get_model_info").json()["model_path"]


@pytest.mark.parametrize(
    "body, needle",
    [
        ({"input_ids": [1, 5], "sampling_params": {"max_tokens": 5}}, "max_tokens"),
        ({"input_ids": [1, 5], "max_new_tokens": 5}, "max_new_tokens"),
        ({"input_ids": [1, 5], "sampling_params": {"max_new_tokens": "5"}}, "max_new_tokens"),
        ({"input_ids": [1, 5], "sampling_params": {"temperature": -1}}, "temperature"),
        ({"input_ids": [1, 5], "sampling_params": {"top_p": 0}}, "top_p"),
        ({"input_ids": [1, 5], "sampling_params": {"frequency_penalty": 0.5}}, "frequency_penalty"),
        ({"input_ids": "1 5"}, "input_ids"),
        ({"input_ids": [1, 10**6]}, "input_ids"),
        ({"input_ids": []}, "empty"),
        ({"text": "ab", "input_ids": [1]}, "exactly one"),
        ({"input_ids": [1, 5], "return_logprob": "yes"}, "return_logprob"),
        ({"input_ids": [1, 5], "stream": "yes"}, "stream"),
        ({"input_ids": [1, 5], "stream": True, "sampling_params": {"stream_interval": 0}}, "stream_interval"),
        ({"input_ids": [1] * 600}, "context length"),
        ({"input_ids": [1] * 100, "sampling_params": {"max_new_tokens": 500}}, "context length"),
        ([1, 2, 3], "JSON object"),
    ],
)
def test_bad_generate_requests_get_400(server, body, needle):
    r = requests.post(server.url + "/generate", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]


def test_invalid_json_unknown_route_and_method_then_still_serving(server):
    r = requests.post(server.url + "/generate", data="{not json", timeout=30)
    assert r.status_code == 400 and "invalid JSON" in r.json()["error"]["message"]
    assert requests.post(server.url + "/generate_v2", json={}).status_code == 404
    assert requests.get(server.url + "/generate").status_code == 405
    r = requests.post(server.url + "/pause_generation", json={"mode": "later"})
    assert r.status_code == 400 and "mode" in r.json()["error"]["message"]
    r = requests.post(server.url + "/update_weights_from_disk", json={"model_path": 3})
    assert r.status_code == 400
    assert generate(server, input_ids=[1, 5], sampling_params={"max_new_tokens": 2})


def test_abort_request_by_rid_returns_tokens_so_far(server):
    with ThreadPoolExecutor(1) as pool:
        # paused in place, the request is certainly mid-generation when the abort arrives
        (fut,), _ = pause_mid_generation(
            server.url,
            lambda: [
                pool.submit(
                    generate,
                    server,
                    input_ids=[1, 5, 6],
                    rid="to-abort",
                    sampling_params={"max_new_tokens": 400, "ignore_eos": True},
                )
            ],
        )
        try:
            r = requests.post(server.url + "/abort_request", json={"rid": "to-abort"})
            assert r.status_code == 200
            out = fut.result(timeout=60)
        finally:
            assert requests.post(server.url + "/continue_generation", json={}).status_code == 200
    meta = out["meta_info"]
    assert meta["finish_reason"]["type"] == "abort"
    assert meta["id"] == "to-abort" and meta["completion_tokens"] == len(out["output_ids"]) < 400


def stream_chunks(server, **body) -> list:
    """A streamed /generate's server-sent events, parsed (the last is the "[DONE]" marker)."""
    import json

    events = []
    with requests.post(server.url + "/generate", json={**body, "stream": True}, stream=True, timeout=120) as r:
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream"), r.text
        for line in r.iter_lines():
            if line:
                assert line.startswith(b"data: "), line
                data = line[len(b"data: ") :]
                events.append("[DONE]" if data == b"[DONE]" else json.loads(data))
    return events


def test_streamed_generate_sends_a_chunk_every_interval_then_the_answer(server):
    """As SGLang without --incremental-streaming-output: each chunk holds the output so far, every
    sampling_params.stream_interval tokens, finish_reason null until the last; the last is the
    answer the same request gets unstreamed; then [DONE]."""
    body = {
        "input_ids": prompt_ids(7, 4),
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": 10, "temperature": 0.0, "ignore_eos": True},
    }
    whole = generate(server, **body)
    body["sampling_params"]["stream_interval"] = 4
    *chunks, done = stream_chunks(server, **body)
    assert done == "[DONE]"
    assert [c["meta_info"]["completion_tokens"] for c in chunks] == [4, 8, 10]
    assert [c["meta_info"]["finish_reason"] for c in chunks[:-1]] == [None, None]
    last = chunks[-1]
    assert last["output_ids"] == whole["output_ids"] and last["meta_info"]["finish_reason"]["type"] == "length"
    assert last["meta_info"]["output_token_logprobs"] == whole["meta_info"]["output_token_logprobs"]
    for c in chunks:
        n = c["meta_info"]["completion_tokens"]
        assert c["output_ids"] == whole["output_ids"][:n]
        assert c["meta_info"]["output_token_logprobs"] == whole["meta_info"]["output_token_logprobs"][:n]
        assert c["meta_info"]["weight_version"] == "default"
        assert c["meta_info"]["output_version_spans"] == [[0, "default"]]
    # the default interval is one token
    one = stream_chunks(server, input_ids=[1, 5], sampling_params={"max_new_tokens": 3, "ignore_eos": True})
    assert [c["meta_info"]["completion_tokens"] for c in one[:-1]] == [1, 2, 3]


def test_a_client_that_leaves_a_stream_aborts_its_request(server):
    """Closing the stream mid-answer stops the generation (the server would otherwise spend
    compute on an answer nobody reads)."""
    before = requests.get(server.url + "/server_info").json()["batching"]["requests_aborted"]
    body = {"input_ids": [1, 5, 6], "stream": True, "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}
    with requests.post(server.url + "/generate", json=body, stream=True, timeout=120) as r:
        first = next(line for line in r.iter_lines() if line)
        assert first.startswith(b"data: ")
    wait_for(
        lambda: requests.get(server.url + "/server_info").json()["batching"]["requests_aborted"] > before,
        lambda: f"the left stream aborted: {server_load(server.url)}",
    )
    wait_for(lambda: server_load(server.url)["running"] == 0, "nothing running after the stream was left")


def test_info_routes(server):
    info = requests.get(server.url + "/get_model_info").json()
    assert info["is_generation"] is True and info["weight_version"] == "default"
    assert requests.get(server.url + "/model_info").json()["weight_version"] == "default"
    gone = requests.get(server.url + "/get_weight_version")  # as SGLang (0.5.9 on): a 404 naming /model_info
    assert gone.status_code == 404 and "/model_info" in gone.text
    info, legacy = (requests.get(server.url + route).json() for route in ("/server_info", "/get_server_info"))
    assert info.keys() == legacy.keys() and info["version"] == legacy["version"] == "areal-builtin"
    assert requests.get(server.url + "/health_generate", timeout=30).status_code == 200
    assert requests.post(server.url + "/flush_cache").status_code == 200
    assert requests.get(server.url + "/v1/models").json()["data"][0]["id"]


JSON = {"Content-Type": "application/json"}
OK_BODY = {"input_ids": [1, 5], "sampling_params": {"max_new_tokens": 2}}
# (method, path, raw body or JSON-able value, headers, expected status, text in the message)
MALFORMED = [
    ("POST", "/generate", b"{not json", JSON, 400, "invalid JSON"),
    ("POST", "/generate", b"", JSON, 400, "needs a JSON body"),
    ("POST", "/generate", b"[" * 100_000, JSON, 400, "invalid JSON"),  # nesting too deep
    ("POST", "/generate", b'{"input_ids": [' + b"9" * 5000 + b"]}", JSON, 400, "invalid JSON"),
    ("POST", "/generate", b'{"text": "\xff\xfe"}', JSON, 400, "invalid JSON"),  # not UTF-8
    ("POST", "/generate", b'{"input_ids": [1], "sampling_params": {"temperature": NaN}}', JSON, 400, "temperature"),
    ("POST", "/generate", None, JSON, 400, "JSON object"),
    ("POST", "/generate", "a prompt", JSON, 400, "JSON object"),
    ("POST", "/generate", 42, JSON, 400, "JSON object"),
    ("POST", "/generate", {"input_ids": {"0": 1}}, JSON, 400, "input_ids"),
    ("POST", "/generate", {"input_ids": [[1, 5]]}, JSON, 400, "input_ids"),
    ("POST", "/generate", {"input_ids": [1, 5], "sampling_params": [2]}, JSON, 400, "sampling_params"),
    ("POST", "/generate", {"input_ids": [1, 5], "sampling_params": {"temperature": "hot"}}, JSON, 400, "temperature"),
    ("POST", "/generate", {"input_ids": [1, 5], "rid": 7}, JSON, 400, "rid"),
    ("POST", "/generate", {"input_ids": [1, 5], "sampling_params": {"n": 10**9}}, JSON, 400, "'n'"),
    (
        "POST",
        "/generate",
        {"input_ids": [1, 5], "sampling_params": {"max_new_tokens": 10**12}},
        JSON,
        400,
        "context length",
    ),
    ("POST", "/generate", {"input_ids": [1] * 100_000}, JSON, 400, "context length"),
    ("POST", "/generate", {"input_ids": [1, 10**30]}, JSON, 400, "input_ids"),
    ("POST", "/generate", b'{"input_ids": [1, 5]}', {"Content-Type": "text/plain"}, 415, "Content-Type"),
    (
        "POST",
        "/generate",
        b'{"input_ids": [1, 5]}',
        {"Content-Type": "application/x-www-form-urlencoded"},
        415,
        "application/json",
    ),
    ("POST", "/generate", b" " * (5 * 2**20), JSON, 413, "size limit"),
    ("POST", "/abort_request", b"", JSON, 400, "needs a JSON body"),
    ("POST", "/update_weights_from_disk", {"model_path": ["a"]}, JSON, 400, "model_path"),
    ("POST", "/init_weights_update_group", {"master_port": "x"}, JSON, 400, "master_port"),
    ("GET", "/no_such_route", None, {}, 404, "No route"),
    ("POST", "/v1/chat/completions", {}, JSON, 400, "'messages'"),
    ("POST", "/v1/no_such_route", {}, JSON, 404, "No route"),
    ("GET", "/generate", None, {}, 405, "not allowed"),
    ("DELETE", "/health", None, {}, 405, "not allowed"),
]


def test_malformed_requests_get_4xx_with_a_message_and_the_server_keeps_serving(server):
    import json

    for method, path, body, headers, status, needle in MALFORMED:
        data = body if isinstance(body, bytes) or (body is None and method != "POST") else json.dumps(body).encode()
        r = requests.request(method, server.url + path, data=data, headers=headers, timeout=30)
        what = f"{method} {path} {str(body)[:60]!r}"
        assert r.status_code == status, f"{what}: {r.status_code} {r.text[:300]}"
        reply = r.json()
        message = reply["error"]["message"] if "error" in reply else reply["message"]
        assert needle in message, f"{what}: {message}"
    # extreme but valid: a top_k beyond the vocabulary means "no top-k" (it used to overflow
    # torch and fail the whole running batch)
    assert generate(server, input_ids=[1, 5], sampling_params={"max_new_tokens": 2, "top_k": 10**20})
    assert requests.get(server.url + "/health", timeout=10).status_code == 200
    assert generate(server, **OK_BODY)["meta_info"]["completion_tokens"] == 2
