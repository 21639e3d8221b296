"""scripts/dev/bench_gil_switch.py: one row per interval, and the process's interval restored."""

import importlib.util
import json
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "dev" / "bench_gil_switch.py"
_spec = importlib.util.spec_from_file_location("bench_gil_switch", SCRIPT)
bench_gil_switch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_gil_switch)


def test_rows_per_interval_and_interval_restored(tmp_path):
    before = sys.getswitchinterval()
    out = tmp_path / "g.json"
    assert (
        bench_gil_switch.main(["--out", str(out), "--intervals-ms", "5", "0.2", "--ops", "200", "--repeats", "1"]) == 0
    )
    assert sys.getswitchinterval() == before
    rows = json.loads(out.read_text())["rows"]
    assert [r["interval_ms"] for r in rows] == [5.0, 0.2]
    for r in rows:
        # timings are for the JSON, not for asserts (a loaded machine may not run the busy thread at all)
        assert r["alone_us_per_op"] > 0 and r["contended_us_per_op"] > 0 and r["busy_thread_units_per_s"] >= 0
