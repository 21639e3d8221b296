"""Command line of `python -m areal.server`: flag errors, API key, token-only mode."""

import subprocess
import sys

import pytest
import requests

KEY = "s3cret"


@pytest.mark.parametrize("flags, needle", [
    (["--tp-size", "2"], "--tp-size 2 is not supported"),
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["--dtype", "int8"], "--dtype"),
    (["--max-running-requests", "0"], "--max-running-requests 0"),
])
def test_flag_errors_exit_2(flags, needle):
    proc = subprocess.run([sys.executable, "-m", "areal.server", "--model-path", "x", *flags],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    from areal.server.testing import start_server

    handle = start_server(tiny_model_dir, extra_args=[
        "--api-key", KEY, "--skip-tokenizer-init", "--mem-fraction-static", "0.8",
        "--random-seed", "3", "--log-level", "warning"])
    yield handle
    assert handle.stop() == 0, handle.log()  # SIGTERM: clean exit


def test_api_key_required_except_health(server):
    body = {"input_ids": [1, 5, 6], "sampling_params": {"max_new_tokens": 3}}
    assert requests.get(server.url + "/health").status_code == 200
    assert requests.post(server.url + "/generate", json=body).status_code == 401
    assert requests.get(server.url + "/get_model_info").status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert requests.post(server.url + "/generate", json=body, headers=wrong).status_code == 401
    good = {"Authorization": f"Bearer {KEY}"}
    r = requests.post(server.url + "/generate", json=body, headers=good)
    assert r.status_code == 200 and len(r.json()["output_ids"]) == 3
    assert "text" not in r.json()  # --skip-tokenizer-init: token ids only, as in SGLang
    r = requests.post(server.url + "/generate", json={"text": "ab"}, headers=good)
    assert r.status_code == 400 and "--skip-tokenizer-init" in r.json()["error"]["message"]
    info = requests.get(server.url + "/get_server_info", headers=good).json()
    assert "api_key" not in info
