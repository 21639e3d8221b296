"""scripts/trace_summary.py: window, phases, device busy union, gap attribution and host self time of
torch.profiler Chrome traces (a real CPU trace and a hand-built GPU-style one)."""

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.scripts import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "trace_summary.py"
trace_summary = load_script("trace_summary")

MS = 1000.0  # the hand-built traces are written in milliseconds; Chrome traces count microseconds


def x(cat, name, start_ms, end_ms, pid=1, tid=1):
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": pid,
        "tid": tid,
        "ts": start_ms * MS,
        "dur": (end_ms - start_ms) * MS,
    }


def kernel(name, start_ms, end_ms, stream):
    return x("kernel", name, start_ms, end_ms, pid=0, tid=stream)


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory):
    """A real profile of a small Linear forward/backward inside areal/step > areal/phase/train."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, record_function

    model, batch = torch.nn.Linear(16, 8), torch.randn(4, 16)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("areal/step"):
            with record_function("areal/phase/train"):
                model(batch).sum().backward()
    path = tmp_path_factory.mktemp("trace") / "step.json"
    prof.export_chrome_trace(str(path))  # a profile exports once: make the .gz copy by hand
    with open(path, "rb") as src, gzip.open(str(path) + ".gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    return path


def test_real_cpu_trace_has_phase_and_host_ops_by_self_time(cpu_trace):
    events = trace_summary.load_events(str(cpu_trace))
    s = trace_summary.summarize_events(events, top=1000)
    assert s["window_source"] == "span of the areal/* annotations"
    assert [p["name"] for p in s["phases"]] == ["areal/phase/train"]
    assert 0 < s["phases"][0]["ms"] <= s["window_ms"]
    assert not s["has_device"] and s["kernels"] == [] and s["gaps_by_class"] == {}
    ops = {op["name"]: op for op in s["host_ops"]}
    assert ops.keys() & {"aten::addmm", "aten::linear"}
    assert all(ops[name]["self_ms"] > 0 for name in ops.keys() & {"aten::addmm", "aten::linear"})
    inclusive_ms = {}
    for ev in events:
        if ev.get("ph") == "X" and ev.get("cat") == "cpu_op":
            inclusive_ms[ev["name"]] = inclusive_ms.get(ev["name"], 0.0) + ev["dur"] / MS
    for name, op in ops.items():  # self time never exceeds the time inside the op
        assert op["self_ms"] <= inclusive_ms[name] + 1e-5  # ts near 5e12 us: each time rounds at ~1e-3 us
    assert sum(op["self_ms"] for op in s["host_ops"]) <= s["window_ms"]  # one thread: self times do not overlap


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_real_cpu_trace_report_json_and_gz(cpu_trace, suffix):
    report = trace_summary.summarize(str(cpu_trace) + suffix, top=5)
    assert report.startswith(f"## {cpu_trace}{suffix}\n")
    assert "| areal/phase/train | 1 |" in report
    assert "No device events" in report
    assert "aten::" in report and "### Gaps" not in report


def gpu_events():
    """Window [0, 100] ms (areal/step); phases rollout [0, 40] and train [40, 100].

    Device busy: [0, 15] (k_a and k_c overlap on two streams), [20, 35] (k_b and k_a overlap),
    [50, 55] (memcpy), [80, 90] (k_b) = 45 ms. Idle: [15, 20], [35, 50], [55, 80], [90, 100] = 55 ms.
    """
    return [
        x("user_annotation", "areal/step", 0, 100),
        x("user_annotation", "ProfilerStep#3", 0, 100),  # wraps everything: says nothing about the host
        x("user_annotation", "areal/phase/rollout", 0, 40),
        x("user_annotation", "areal/phase/train", 40, 100),
        x("gpu_user_annotation", "areal/phase/train", 40, 100, pid=0, tid=7),  # not device work, not a phase
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "ts": -500 * MS, "args": {"name": "GPU 0"}},
        kernel("k_a", 0, 10, stream=7),
        kernel("k_c", 5, 15, stream=8),
        kernel("k_b", 20, 30, stream=7),
        kernel("k_a", 25, 35, stream=8),
        x("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 50, 55, pid=0, tid=7),
        kernel("k_b", 80, 90, stream=7),
        kernel("k_late", 100, 120, stream=7),  # after the window
        x("cpu_op", "aten::early", -10, -5),  # before the window
        # gap [15, 20]: a synchronize inside an op -> synchronisation 5
        x("cpu_op", "aten::item", 10, 21),
        x("cuda_runtime", "cudaStreamSynchronize", 12, 20),
        # gap [35, 50]: op [35, 46] around cudaMalloc [36, 44], then nothing -> allocation 8, Python 3, idle 4
        x("cpu_op", "aten::empty", 35, 46),
        x("cuda_runtime", "cudaMalloc", 36, 44),
        # gap [55, 80]: Python 15, launch 2, async copy 3, nothing 5
        x("python_function", "train.py(12): loss", 55, 70),
        x("cuda_runtime", "cudaLaunchKernel", 70, 72),
        x("cuda_runtime", "cudaMemcpyAsync", 72, 75),
        # gap [90, 100]: nothing -> idle 10
    ]


def test_gpu_union_and_top_kernels():
    s = trace_summary.summarize_events(gpu_events(), top=3)
    assert s["window_ms"] == pytest.approx(100)
    assert s["device_busy_ms"] == pytest.approx(45)
    assert s["device_busy_pct"] == pytest.approx(45)
    assert [(k["name"], k["count"]) for k in s["kernels"]] == [("k_a", 2), ("k_b", 2), ("k_c", 1)]
    assert [k["ms"] for k in s["kernels"]] == pytest.approx([20, 20, 10])
    assert s["kernels"][0]["pct_of_busy"] == pytest.approx(100 * 20 / 45)
    assert s["device_ms_by_kind"] == pytest.approx({"kernel": 50, "memcpy": 5})
    assert [(p["name"], p["count"]) for p in s["phases"]] == [("areal/phase/rollout", 1), ("areal/phase/train", 1)]
    assert [p["ms"] for p in s["phases"]] == pytest.approx([40, 60])
    assert s["host_ops"] == []


def test_gpu_gaps_by_class_and_phase():
    s = trace_summary.summarize_events(gpu_events())
    assert s["gaps_ms"] == pytest.approx(55)
    assert s["gaps_by_class"] == pytest.approx(
        {
            "synchronisation": 5,
            "allocation": 8,
            "host-device copies": 3,
            "kernel launch": 2,
            "Python / CPU ops": 3 + 15,
            "host idle (other threads / waiting)": 4 + 5 + 10,
        }
    )
    # rollout [0, 40] holds idle [15, 20] and [35, 40]; train holds [40, 50], [55, 80], [90, 100]
    assert s["gaps_by_phase"] == pytest.approx({"areal/phase/rollout": 10, "areal/phase/train": 45})


def test_gpu_gaps_name_the_host_ops_that_ran_while_the_device_sat_idle():
    events = gpu_events() + [
        x("cpu_op", "aten::copy_", 92, 99, tid=2),  # another thread, in the idle [90, 100]
        x("cpu_op", "aten::mm", 82, 88, tid=2),  # the device was busy then: not idle time
    ]
    rows = trace_summary.summarize_events(events)["idle_host_ops"]
    got = [(r["thread"], r["name"], round(r["idle_ms"], 6)) for r in rows]
    assert got == (
        [
            (1, "train.py(12): loss", 15),
            (1, "cudaMalloc", 8),
            (2, "aten::copy_", 7),
            (1, "cudaStreamSynchronize", 5),
            (1, "aten::empty", 3),  # its 11 ms in idle time, less cudaMalloc's 8
            (1, "cudaMemcpyAsync", 3),
            (1, "cudaLaunchKernel", 2),
        ]
    )  # aten::item's idle time is all its child's (the synchronize): it has none of its own
    assert rows[0]["cat"] == "python_function" and rows[0]["count"] == 1


def test_gpu_report_lists_memcpy_and_gap_classes(tmp_path):
    path = tmp_path / "rank0.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(gpu_events(), f)  # a bare list is a valid trace too
    report = trace_summary.summarize(str(path))
    assert "Device busy: 45.000 ms (45.0% of window" in report
    assert "| Memcpy HtoD (Pageable -> Device) | memcpy | 1 | 5.000 | 11.1 |" in report
    assert "| synchronisation | 5.000 | 5.0 |" in report
    assert "| areal/phase/train | 45.000 | 75.0 |" in report
    assert "| 1 | python_function | train.py(12): loss | 1 | 15.000 | 15.0 |" in report
    assert "No device events" not in report


def test_window_without_areal_annotations_spans_all_events():
    events = [kernel("k", 10, 20, stream=7), x("cpu_op", "aten::mm", 0, 5), x("cpu_op", "aten::add", 25, 30)]
    s = trace_summary.summarize_events(events)
    assert s["window_source"] == "first to last event"
    assert s["window_ms"] == pytest.approx(30)
    assert s["gaps_by_class"]["Python / CPU ops"] == pytest.approx(10)
    assert s["gaps_by_class"]["host idle (other threads / waiting)"] == pytest.approx(10)
    assert s["gaps_by_phase"] == pytest.approx({trace_summary.NO_PHASE: 20})


def test_self_time_subtracts_direct_children_per_thread():
    events = [
        x("cpu_op", "parent", 0, 10),
        x("cpu_op", "child", 1, 3),
        x("cpu_op", "child", 4, 8),
        x("cpu_op", "grandchild", 5, 6),
        x("cpu_op", "parent", 2, 9, tid=2),  # another thread: not a child of the first parent
    ]
    ops = {op["name"]: op for op in trace_summary.summarize_events(events)["host_ops"]}
    assert ops["parent"]["self_ms"] == pytest.approx(10 - 2 - 4 + 7)
    assert ops["parent"]["count"] == 2
    assert ops["child"]["self_ms"] == pytest.approx(2 + 3)
    assert ops["grandchild"]["self_ms"] == pytest.approx(1)


def test_a_zero_length_window_reports_zero_shares(tmp_path):
    path = tmp_path / "instant.json"
    path.write_text(json.dumps([x("cpu_op", "aten::empty", 5, 5), x("kernel", "k", 5, 5, pid=0, tid=7)]))
    report = trace_summary.summarize(str(path))
    assert "Window: 0.000 ms" in report and "Device busy: 0.000 ms (0.0% of window" in report


def test_top_must_be_a_positive_whole_number(capsys):
    with pytest.raises(SystemExit):
        trace_summary.main(["trace.json", "--top", "0"])
    assert "'0' is not a whole number >= 1" in capsys.readouterr().err


@pytest.mark.parametrize(
    "content, why",
    [
        ("not json at all", "cannot be read as JSON"),
        ('{"schemaVersion": 1}', "without a 'traceEvents' list"),
        ('{"traceEvents": []}', "no complete"),
        ('[{"ph": "M", "name": "process_name"}]', "no complete"),
        ('[{"ph": "X", "name": "aten::mm", "ts": "soon", "dur": 1}]', "'aten::mm'"),
    ],
    ids=["not-json", "no-traceEvents", "no-events", "no-complete-events", "ts-not-a-number"],
)
def test_a_file_that_is_not_a_trace_is_named(tmp_path, content, why):
    path = tmp_path / "metrics.json"
    path.write_text(content)
    with pytest.raises(SystemExit, match=why) as err:
        trace_summary.summarize(str(path))
    assert str(path) in str(err.value)


def test_a_gz_that_is_not_gzip_is_named(tmp_path):
    path = tmp_path / "broken.json.gz"
    path.write_text("{}")
    with pytest.raises(SystemExit, match="broken.json.gz"):
        trace_summary.summarize(str(path))


def test_cli_writes_one_report_per_trace(tmp_path, cpu_trace):
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps({"traceEvents": gpu_events()}))
    out = tmp_path / "report.md"
    cmd = [sys.executable, str(SCRIPT), str(cpu_trace), str(gpu), "--top", "2", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    report = out.read_text()
    assert report.count("\n## ") == 1 and report.startswith(f"## {cpu_trace}\n")
    assert f"## {gpu}\n" in report and "| k_c |" not in report  # --top 2 keeps k_a and k_b


def test_cli_names_a_bad_file_without_traceback(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello")
    done = subprocess.run([sys.executable, str(SCRIPT), str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "notes.txt" in done.stderr and "Traceback" not in done.stderr
