"""/pause_generation (abort, retract, in_place) and /continue_generation with requests in flight."""

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.server.helpers import prompt_ids
from tests.serving import pause_mid_generation, server_load, wait_for

N_NEW = 300  # long: a pause that comes too late is retried (pause_mid_generation)
PROMPTS = [prompt_ids(100 + i, 5) for i in range(4)]


@pytest.fixture(scope="module")
def server(varied_model_dir):
    from tests.serving import start_server

    handle = start_server(varied_model_dir, extra_args=["--dtype", "float32"])
    yield handle
    assert handle.stop() == 0, handle.log()


def post(server, path, body, timeout=120):
    return requests.post(server.url + path, json=body, timeout=timeout)


def generate(server, prompt, n=N_NEW):
    r = post(
        server,
        "/generate",
        {"input_ids": prompt, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}},
    )
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def reference(server):
    with ThreadPoolExecutor(4) as pool:
        return [o["output_ids"] for o in pool.map(lambda p: generate(server, p), PROMPTS)]


def stats(server):
    info = requests.get(server.url + "/get_server_info").json()
    return info["batching"], info["load"]


def held_at_the_gate(server, n):
    """Until n requests are inside the server (held, queued or running): a request sent while
    paused has arrived, rather than being assumed to after a delay."""
    wait_for(
        lambda: server_load(server.url)["accepted"] == n,
        lambda: f"{n} requests in the server: {server_load(server.url)}",
    )


@pytest.mark.parametrize("mode", ["in_place", "retract"])
def test_pause_holds_requests_and_continue_resumes(server, reference, mode):
    with ThreadPoolExecutor(5) as pool:
        tokens_at_start = []

        def start():
            tokens_at_start.append(stats(server)[0]["generated_tokens"])
            return [pool.submit(generate, server, p) for p in PROMPTS]

        futures, r = pause_mid_generation(server.url, start, len(PROMPTS), mode=mode)
        assert r["status"] == "ok" and r["requests_held"] == len(PROMPTS) and r["pause_s"] >= 0
        before = stats(server)[0]["generated_tokens"]
        old_version = requests.get(server.url + "/model_info").json()["weight_version"]
        new_version = f"{mode}-1"  # as a weight update sets it, while the requests wait
        assert post(server, "/update_weight_version", {"new_version": new_version, "abort_all_requests": False}).ok
        late = pool.submit(generate, server, PROMPTS[0], 5)  # arrives while paused
        held_at_the_gate(server, len(PROMPTS) + 1)
        assert stats(server)[0]["generated_tokens"] == before  # no new tokens while paused
        assert not any(f.done() for f in futures) and not late.done()
        assert post(server, "/continue_generation", {}).status_code == 200
        outs = [f.result(timeout=120) for f in futures]
        assert late.result(timeout=60)["output_ids"] == reference[0][:5]
        assert late.result()["meta_info"]["output_version_spans"] == [[0, new_version]]
    assert [o["output_ids"] for o in outs] == reference
    # which tokens each version produced: the switch is where the pause stopped each request
    spans = [o["meta_info"]["output_version_spans"] for o in outs]
    assert all(s[0] == [0, old_version] and s[1][1] == new_version and len(s) == 2 for s in spans)
    assert sum(s[1][0] for s in spans) == before - tokens_at_start[-1]
    assert all(o["meta_info"]["finish_reason"]["type"] == "length" for o in outs)
    retracted = [o["meta_info"]["total_retractions"] for o in outs]
    assert retracted == ([1] * 4 if mode == "retract" else [0] * 4)


def test_pause_abort_returns_partial_outputs_and_gates_new_requests(server, reference):
    with ThreadPoolExecutor(5) as pool:
        futures, r = pause_mid_generation(
            server.url, lambda: [pool.submit(generate, server, p) for p in PROMPTS], len(PROMPTS), mode=None
        )  # the default mode: abort
        assert r["requests_aborted"] == len(PROMPTS)
        # returned while still paused (the hang guard is generous: continue comes only later)
        outs = [f.result(timeout=120) for f in futures]
        late = pool.submit(generate, server, PROMPTS[1], 5)
        held_at_the_gate(server, 1)
        assert not late.done()
        assert post(server, "/continue_generation", {}).status_code == 200
        assert late.result(timeout=60)["output_ids"] == reference[1][:5]
    for out, ref in zip(outs, reference):
        meta = out["meta_info"]
        assert meta["finish_reason"]["type"] == "abort"
        assert 0 < meta["completion_tokens"] == len(out["output_ids"]) < N_NEW
        assert out["output_ids"] == ref[: len(out["output_ids"])]  # the prefix is kept
