"""scripts/bench_paths.py at a tiny shape: RLVR through the executor and a real built-in server,
and reward scores pending on a RewardRunner. Every episode finishes, every sample has its reward,
every score is right, and the JSON holds what was printed. No timing asserts."""

from __future__ import annotations

import json

import pytest

from tests.scripts import load_script


@pytest.mark.slow
def test_bench_paths_smoke(tmp_path):
    bench = load_script("bench_paths")
    out = tmp_path / "paths.json"
    r = bench.main(
        ["--paths", "rlvr", "reward", "--episodes", "8", "--n-samples", "4", "--scores", "64", "--out", str(out)]
    )
    assert json.loads(out.read_text()) == r
    rlvr = r["rlvr"]
    assert rlvr["errors"] == {}, rlvr["error_examples"]
    assert rlvr["episodes_finished"] == 8 and rlvr["samples_with_reward"] == 32
    assert rlvr["peak_requests_in_flight_client"] == 32
    assert rlvr["http_statuses_seen"].get("200") == 32 and rlvr["http_failures_seen"] == {}
    assert rlvr["server_health_after"] == 200 and rlvr["server_accepted_after"] == 0
    assert rlvr["peak_fds_client"] > 32 and rlvr["peak_fds_server"] > 0
    reward = r["reward"]
    assert reward["errors"] == {} and reward["returned"] == reward["correct"] == 64 and reward["timeouts"] == 0
