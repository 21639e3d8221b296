"""CPU smoke run of scripts/bench_weight_sync.py: a tiny model, disk and gloo updates to a real
built-in server; checks the JSON it writes and that its consistency check passed (no timing
asserts: the numbers of a loaded 2-core machine mean nothing)."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_weight_sync.py"


@pytest.mark.slow
@pytest.mark.second_lane
def test_tiny_cpu_disk_and_gloo(tmp_path):
    out = tmp_path / "ws.json"
    main = runpy.run_path(str(SCRIPT), run_name="bench_weight_sync")["main"]
    rc = main(
        [
            "--shape",
            "tiny",
            "--device",
            "cpu",
            "--modes",
            "disk",
            "gloo",
            "--repeats",
            "1",
            "--warmup",
            "1",
            "--bucket-mb",
            "1",
            "64",
            "--workdir",
            str(tmp_path / "models"),
            "--out",
            str(out),
        ]
    )
    result = json.loads(out.read_text())
    assert rc == 0 and result["checks_passed"] is True and result["errors"] == {}
    tiny = result["shapes"]["tiny"]
    assert tiny["disk_fs"] and Path(tiny["disk_dir"]).name.startswith("areal-bench-ws-")
    assert not Path(tiny["disk_dir"]).exists()  # cleaned up
    assert set(tiny["modes"]) == {"disk", "gloo"}
    assert [r["bucket_mb"] for r in tiny["modes"]["gloo"]["runs"]] == [1, 64]
    sizes = set()
    for mode, m in tiny["modes"].items():
        check = m["check"]
        assert check["passed"] and all(check["checks"].values()), check
        assert check["gap_before"]["mean"] > check["gap_after"]["mean"]
        for run in m["runs"]:
            assert run["seconds"] > 0 and run["gb_per_s"] > 0 and len(run["samples"]) == 1
            assert set(run["split_s"]) == {"gather", "transfer", "load", "other", "server_load"}
            assert abs(sum(run["split_s"][k] for k in ("gather", "transfer", "load", "other")) - run["seconds"]) < 1e-6
            raw = run["samples"][0]["raw"]
            assert raw["weight_update/gather_s"] > 0 and raw["weight_update/transfer_s"] > 0
            assert raw["weight_update/server_load_s"] > 0  # the server reported its load time
            sizes.add(run["bytes"])
    assert len(sizes) == 1  # disk and broadcast carry the same bf16 weights
    assert {(r["shape"], r["mode"]) for r in result["rows"]} == {("tiny", "disk"), ("tiny", "gloo")}
