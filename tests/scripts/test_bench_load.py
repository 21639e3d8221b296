"""scripts/bench_load.py, shortened: 1,000 concurrent clients for 15 s against a real built-in server
with a small queue, so it both answers and rejects. Every request must get a 200 or an error status
with a JSON message (no reset connection, no timeout), the server's memory growth stays bounded
and it is healthy afterwards. No timing asserts: a loaded 2-core machine's numbers mean nothing."""

from __future__ import annotations

import json

import pytest

from tests.scripts import load_script


@pytest.mark.slow
@pytest.mark.second_lane
def test_thousand_concurrent_clients_are_answered_or_told_why(tmp_path):
    bench = load_script("bench_load")
    out = tmp_path / "load.json"
    r = bench.main(
        [
            "--concurrency",
            "1000",
            "--duration",
            "15",
            "--out",
            str(out),
            "--server-args",
            "--max-running-requests 64 --max-queued-requests 256",
        ]
    )
    assert json.loads(out.read_text()) == r
    assert r["errors"] == {}, r["examples"]
    assert r["answered_200"] > 0 and r["requests_sent"] == r["answered_200"] + sum(r["rejected"].values())
    assert set(r["rejected"]) <= {"503"}, r["examples"]
    if r["rejected"]:
        assert "--max-queued-requests 256" in r["examples"]["503"]
    assert r["server_capacity"] == 320 and r["server_accepted_after"] == 0
    assert r["server_batching"]["requests_served"] >= r["answered_200"]
    assert r["server_rss"]["growth_peak_mib"] < 1024, r["server_rss"]
    assert r["health_after"] == 200
