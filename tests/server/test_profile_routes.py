"""/start_profile and /stop_profile on the built-in server (areal/server/routes_profile.py): the
trace lands at SGLang's path and holds the model's ops (run on the scheduler's worker thread),
SGLang's refusals, the fields this server does not implement, and the API key."""

import gzip
import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

KEY = "prof-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
STARTED, STOPPED = "Start profiling.\n", "Stop profiling. This will take some time.\n"
ALREADY = "Profiling is already in progress. Call /stop_profile first."
NOT_RUNNING = "Profiling is not in progress. Call /start_profile first."
MODEL_OPS = {"aten::linear", "aten::mm", "aten::addmm", "aten::matmul"}


@pytest.fixture(scope="module")
def default_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("default_profiles")


@pytest.fixture(scope="module")
def server(tiny_model_dir, default_dir):
    from tests.serving import start_server

    handle = start_server(
        tiny_model_dir,
        extra_args=["--api-key", KEY, "--dtype", "float32"],
        env={"SGLANG_TORCH_PROFILER_DIR": str(default_dir), "OMP_NUM_THREADS": "1"},
    )
    yield handle
    assert handle.stop() == 0, handle.log()


def call(server, method, path, body=None, headers=AUTH):
    return requests.request(method, server.url + path, json=body, headers=headers, timeout=60)


def generate(server, n=8):
    body = {"input_ids": [1, 5, 6, 7], "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}
    r = call(server, "POST", "/generate", body)
    assert r.status_code == 200, r.text
    return r.json()


def trace_names(path: Path) -> set[str]:
    with gzip.open(path, "rt") as f:
        return {event.get("name") for event in json.load(f)["traceEvents"]}


def message(r):
    return r.json()["error"]["message"]


def test_trace_at_sglang_path_holds_the_models_ops(server, tmp_path):
    out = tmp_path / "traces"  # created by the server
    r = call(server, "POST", "/start_profile", {"output_dir": str(out), "profile_id": "step7"})
    assert (r.status_code, r.text) == (200, STARTED)
    with ThreadPoolExecutor(2) as pool:  # two requests: a batch on the worker thread
        outs = list(pool.map(lambda _: generate(server), range(2)))
    assert all(len(o["output_ids"]) == 8 for o in outs)
    r = call(server, "POST", "/stop_profile")
    assert (r.status_code, r.text) == (200, STOPPED)
    assert [p.name for p in out.iterdir()] == ["step7-TP-0.trace.json.gz"]
    names = trace_names(out / "step7-TP-0.trace.json.gz")
    assert names & MODEL_OPS, sorted(n for n in names if n and n.startswith("aten::"))[:40]
    assert call(server, "GET", "/health", headers={}).status_code == 200


def test_get_without_body_uses_sglang_defaults(server, default_dir):
    """GET means the defaults: output_dir $SGLANG_TORCH_PROFILER_DIR, profile_id str(time.time())."""
    before = set(default_dir.iterdir())
    assert call(server, "GET", "/start_profile").text == STARTED
    generate(server, 2)
    assert call(server, "GET", "/stop_profile").text == STOPPED
    (new,) = set(default_dir.iterdir()) - before
    assert re.fullmatch(r"\d+\.\d+-TP-0\.trace\.json\.gz", new.name), new.name
    assert trace_names(new) & MODEL_OPS


def test_prefix_id_and_nested_dir_name_the_file(server, tmp_path):
    out = tmp_path / "a" / "b"
    body = {
        "output_dir": str(out),
        "profile_prefix": "grpo",
        "profile_id": "step3",
        "activities": ["CPU", "GPU"],
        "with_stack": False,
        "record_shapes": False,
        "start_step": None,
        "num_steps": None,
        "profile_by_stage": False,
        "merge_profiles": False,
        "profile_stages": None,
    }
    assert call(server, "POST", "/start_profile", body).status_code == 200
    assert call(server, "POST", "/stop_profile", {}).status_code == 200
    assert [p.name for p in out.iterdir()] == ["grpo-step3-TP-0.trace.json.gz"]


def test_double_start_and_stop_without_start_are_400(server, tmp_path):
    r = call(server, "POST", "/stop_profile")
    assert r.status_code == 400 and message(r) == NOT_RUNNING
    body = {"output_dir": str(tmp_path), "profile_id": "first", "with_stack": False}
    assert call(server, "POST", "/start_profile", body).status_code == 200
    r = call(server, "POST", "/start_profile", {**body, "profile_id": "second"})
    assert r.status_code == 400 and message(r) == ALREADY
    assert call(server, "POST", "/stop_profile").status_code == 200
    r = call(server, "GET", "/stop_profile")
    assert r.status_code == 400 and message(r) == NOT_RUNNING
    assert [p.name for p in tmp_path.iterdir()] == ["first-TP-0.trace.json.gz"]


@pytest.mark.parametrize(
    "body, needle",
    [
        ({"output_dirr": "/tmp"}, "unknown key(s) ['output_dirr']"),
        ({"num_steps": 5}, "'num_steps'=5 is not supported by the built-in server"),
        ({"start_step": 2}, "'start_step'=2 is not supported by the built-in server"),
        ({"profile_by_stage": True}, "'profile_by_stage'=true is not supported"),
        ({"merge_profiles": True}, "'merge_profiles'=true is not supported"),
        ({"profile_stages": ["prefill"]}, "'profile_stages' is not supported"),
        ({"activities": ["CPU", "MEM"]}, "activities ['MEM'] are not supported by the built-in server"),
        ({"activities": ["RPD"]}, "activities ['RPD'] are not supported"),
        ({"activities": ["TPU"]}, "unknown activities ['TPU']"),
        ({"activities": []}, "'activities' must be null or a non-empty list"),
        ({"with_stack": "yes"}, "'with_stack' must be bool"),
        ({"num_steps": "5"}, "'num_steps' must be int"),
        ({"profile_id": "../x"}, "'profile_id' '../x' must be a non-empty part of a file name"),
    ],
)
def test_bad_start_bodies_are_400_and_start_nothing(server, body, needle):
    r = call(server, "POST", "/start_profile", body)
    assert r.status_code == 400 and needle in message(r), r.text
    if "not supported" in needle:
        assert "call /stop_profile" in message(r)
    assert message(call(server, "POST", "/stop_profile")) == NOT_RUNNING


def test_unknown_key_on_stop_is_400(server):
    r = call(server, "POST", "/stop_profile", {"profile_id": "x"})
    assert r.status_code == 400 and "unknown key(s) ['profile_id']" in message(r)


@pytest.mark.parametrize("method", ["GET", "POST"])
@pytest.mark.parametrize("path", ["/start_profile", "/stop_profile"])
def test_api_key_required(server, method, path):
    assert call(server, method, path, headers={}).status_code == 401
    assert call(server, method, path, headers={"Authorization": "Bearer nope"}).status_code == 401
