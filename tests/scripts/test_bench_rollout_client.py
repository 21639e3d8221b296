"""scripts/bench_rollout_client.py against a real built-in server: every batch is whole and its
client CPU is counted, in the trainer's process and with the episodes in a worker process. No
timing asserts."""

from __future__ import annotations

import json

import pytest

from tests.dataset.gsm8k_data import gsm8k_dir
from tests.scripts import load_script


def load():
    return load_script("bench_rollout_client")


@pytest.mark.parametrize("workers", [0, 1])
def test_each_batch_is_whole_and_its_client_cpu_counted(tmp_path, workers):
    out = tmp_path / "c.json"
    args = ["--out", str(out), "--data", str(gsm8k_dir()), "--batches", "2", "--batch-size", "4", "--n-samples", "2"]
    load().main(args + ["--workers", str(workers)])
    report = json.loads(out.read_text())
    assert report["workers"] == workers and len(report["rows"]) == 2
    for row in report["rows"]:
        assert row["samples"] == 4 * 2
        assert row["client_cpu_s"] > 0 and row["wall_s"] > 0
        assert row["workers_cpu_ms_per_sample"] >= 0
        if not workers:
            assert row["workers_cpu_ms_per_sample"] == 0
    assert report["median_client_cpu_ms_per_sample"] in [r["client_cpu_ms_per_sample"] for r in report["rows"]]


def test_the_workers_cpu_is_read_from_their_processes():
    """Counted from each worker's pid (psutil, 10 ms ticks: too coarse for the test's small batches,
    so read here from a process known to have run: this one)."""
    import os
    import types

    bench = load()
    assert bench.workers_cpu_s(object()) == 0  # an in-process workflow has no pool
    assert bench.workers_cpu_s(types.SimpleNamespace(pool=None)) == 0  # not started yet
    pool = types.SimpleNamespace(pids=[os.getpid()])
    assert bench.workers_cpu_s(types.SimpleNamespace(pool=pool)) > 0
