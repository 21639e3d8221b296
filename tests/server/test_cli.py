"""Command line of `python -m areal.server`: flag errors, API key, token-only mode."""

import subprocess
import sys

import pytest
import requests

KEY = "s3cret"


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--tp-size", "2"], "--tp-size 2 is not supported"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--dtype", "int8"], "--dtype"),
        (["--max-running-requests", "0"], "--max-running-requests 0"),
        (["--max-queued-requests", "-1"], "--max-queued-requests -1"),
        (["--weight-dirs"], "--weight-dirs: expected at least one argument"),
    ],
)
def test_flag_errors_exit_2(flags, needle):
    proc = subprocess.run(
        [sys.executable, "-m", "areal.server", "--model-path", "x", *flags], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    from tests.serving import start_server

    handle = start_server(
        tiny_model_dir,
        extra_args=[
            "--api-key",
            KEY,
            "--skip-tokenizer-init",
            "--mem-fraction-static",
            "0.8",
            "--random-seed",
            "3",
            "--log-level",
            "warning",
            "--max-running-requests",
            "1",
            "--max-queued-requests",
            "1",
        ],
    )
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


AUTH = {"Authorization": f"Bearer {KEY}"}


def test_full_server_answers_503_with_a_message(server):
    """Held (paused), queued and running /generate requests count against
    --max-running-requests + --max-queued-requests (1 + 1 here); one more is refused at once."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    body = {"input_ids": [1, 5, 6], "sampling_params": {"max_new_tokens": 3}}

    def gen():
        return requests.post(server.url + "/generate", json=body, headers=AUTH, timeout=60)

    def load():
        return requests.get(server.url + "/get_server_info", headers=AUTH).json()["load"]

    assert requests.post(server.url + "/pause_generation", json={"mode": "in_place"}, headers=AUTH).status_code == 200
    with ThreadPoolExecutor(2) as pool:
        held = [pool.submit(gen) for _ in range(2)]
        deadline = time.monotonic() + 30
        while load()["accepted"] < 2:
            assert time.monotonic() < deadline, load()
            time.sleep(0.05)
        assert load()["capacity"] == 2
        r = gen()
        assert r.status_code == 503, r.text
        message = r.json()["error"]["message"]
        assert "full" in message and "--max-queued-requests 1" in message
        assert requests.post(server.url + "/continue_generation", json={}, headers=AUTH).status_code == 200
        assert [f.result().status_code for f in held] == [200, 200]
    assert gen().status_code == 200 and load()["accepted"] == 0


def test_without_weight_dirs_the_model_folder_and_default_run_root_are_allowed(server, tiny_model_dir, tmp_path):
    import shutil

    from areal.server.args import default_run_root

    def load(path):
        return requests.post(
            server.url + "/update_weights_from_disk", json={"model_path": path}, headers=AUTH, timeout=60
        )

    r = load(tiny_model_dir)
    assert r.status_code == 200 and r.json()["success"], r.text
    copy = shutil.copytree(tiny_model_dir, tmp_path / "copy")
    r = load(str(copy))
    assert r.status_code == 403, r.text
    assert str(copy) in r.json()["message"] and default_run_root() in r.json()["message"]


def test_damaged_model_folder_exits_1_naming_it(tiny_model_dir, tmp_path):
    import shutil

    model = shutil.copytree(tiny_model_dir, tmp_path / "model")
    (model / "config.json").write_text("{garbage")
    proc = subprocess.run(
        [sys.executable, "-m", "areal.server", "--model-path", str(model)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1, proc.stderr
    assert f"--model-path={model}: the model cannot be loaded" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_defaults_are_safe_by_hand():
    """Started by hand: loopback only, a bounded queue, disk loads limited (see weights.py)."""
    from areal.server.args import DEFAULT_MAX_QUEUED, parse_args

    args = parse_args(["--model-path", "m"])
    assert args.host == "127.0.0.1" and args.weight_dirs is None
    assert args.max_queued_requests == DEFAULT_MAX_QUEUED > 0


def test_start_server_reports_a_server_that_exits_while_starting():
    """start_server waits through areal.infra.health: a server that dies is reported at once, with its log."""
    from areal.infra.health import ServerStartupError
    from tests.serving import start_server

    with pytest.raises(ServerStartupError, match=r"areal.server exited with code 2 before it was healthy") as e:
        start_server("x", extra_args=["--tp-size", "2"], timeout=60)
    assert "--tp-size 2 is not supported" in str(e.value)


def test_sigterm_answers_the_request_in_flight_then_exits_0_with_its_log_written(tmp_path):
    """The server ends without the interpreter's teardown (areal.utils.lifetime.exit_now): what it
    owes must be done before. A request still decoding gets its aborted answer, and the log holds
    the shutdown's last line."""
    import threading

    from areal.models.tiny import make_tiny_model_dir
    from tests.rollout.long_episode import LONG
    from tests.serving import server_load, start_server, wait_for

    model = make_tiny_model_dir(tmp_path / "long", max_position=LONG + 64)
    server = start_server(str(model), extra_args=["--log-level", "info"], env={"OMP_NUM_THREADS": "1"})
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": LONG, "min_new_tokens": LONG}}
    answers = []
    url = server.url + "/generate"
    post = threading.Thread(target=lambda: answers.append(requests.post(url, json=body, timeout=120)))
    post.start()
    try:
        wait_for(lambda: server_load(server.url)["running"] == 1, "the long request running")
    finally:
        code = server.stop()
        post.join(timeout=120)
    assert code == 0, server.log()
    assert answers and answers[0].status_code == 200, server.log()
    assert answers[0].json()["meta_info"]["finish_reason"]["type"] == "abort"
    assert server.log().rstrip().endswith("areal.server INFO shutting down"), server.log()[-2000:]
