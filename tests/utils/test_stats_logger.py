"""StatsLogger: metrics.jsonl lines, the progress line, the PNG plot, and the re-plot CLI."""

import io
import json
import logging
import math

import pytest

from areal.utils.plot import _panels, read_metrics
from areal.utils.stats_logger import REQUIRED_KEYS, StatsLogger, format_progress, main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def step_metrics(step: int) -> dict:
    return {
        "epoch": 0,
        "weight_version": step,
        "rollout/reward_mean": step / 10,
        "train/loss": 1.0 / step,
        "timing/step_s": 0.5,
        "rollout/n_samples": 256,
    }


class TTY(io.StringIO):
    def isatty(self):
        return True


def run_logger(run_dir, n_steps=5, stream=None, **kwargs):
    stream = stream if stream is not None else io.StringIO()
    with StatsLogger(run_dir, total_steps=n_steps, progress_stream=stream, progress_every_s=0, **kwargs) as stats:
        for step in range(1, n_steps + 1):
            stats.log(step, step_metrics(step))
    return stream.getvalue()


def test_one_json_line_per_step_with_the_callers_keys_and_throughput(tmp_path):
    run_logger(tmp_path, n_steps=4)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 4
    records = [json.loads(line) for line in lines]
    for step, rec in enumerate(records, 1):
        assert set(REQUIRED_KEYS) <= set(rec)
        assert {k: rec[k] for k in step_metrics(step)} == step_metrics(step)
        assert rec["step"] == step
        assert rec["throughput/samples_per_s"] == pytest.approx(512.0)


def test_values_become_strict_json(tmp_path):
    torch = pytest.importorskip("torch")
    with StatsLogger(tmp_path, progress=False, plot=False, tensorboard=False) as stats:
        rec = stats.log(
            1,
            {"train/loss": torch.tensor(0.25), "bad": math.nan, "hist": [1, math.inf], "throughput/samples_per_s": 9.0},
        )
    assert rec["train/loss"] == 0.25 and rec["bad"] is None and rec["hist"] == [1, None]
    line = (tmp_path / "metrics.jsonl").read_text()
    assert "NaN" not in line and "Infinity" not in line
    assert json.loads(line)["throughput/samples_per_s"] == 9.0  # given, not derived


def test_appends_across_restarts(tmp_path):
    run_logger(tmp_path, n_steps=2, plot=False)
    run_logger(tmp_path, n_steps=3, plot=False)
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 1, 2, 3]
    with StatsLogger(tmp_path, progress=False, plot=False, tensorboard=False) as stats:
        assert stats.earlier_steps == [1, 2, 1, 2, 3]  # what a fresh run in this folder appends to
    with StatsLogger(tmp_path / "new", progress=False, plot=False, tensorboard=False) as stats:
        assert stats.earlier_steps == []


def test_the_plot_draws_each_steps_last_record():
    """A second run in the same run directory, and a recovery that repeats the steps after its
    checkpoint: one point per step, the last logged, so no line runs back to step 1."""
    from areal.utils.plot import latest_per_step

    first = [{"step": s, "v": "first"} for s in (1, 2, 3)]
    again = [{"step": s, "v": "again"} for s in (1, 2)]
    assert [(r["step"], r["v"]) for r in latest_per_step(first + again)] == [
        (1, "again"),
        (2, "again"),
        (3, "first"),
    ]


def test_close_writes_png_plot(tmp_path):
    pytest.importorskip("matplotlib")
    with StatsLogger(tmp_path, total_steps=3, progress=False) as stats:
        for step in range(1, 4):
            stats.log(step, {**step_metrics(step), "eval/accuracy": step / 4, "eval/accuracy_se": 0.03})
    data = (tmp_path / "metrics.png").read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5000
    titles = dict(_panels(read_metrics(tmp_path / "metrics.jsonl")))
    assert titles["reward"] == ["rollout/reward_mean", "eval/accuracy"]  # the error is a band, not a curve
    assert {"train loss", "throughput (samples/s)"} <= set(titles)


def test_progress_lines_in_a_log_file(tmp_path):
    text = run_logger(tmp_path, n_steps=3, plot=False)
    lines = text.splitlines()
    assert len(lines) == 3 and "\r" not in text
    assert lines[1].startswith("step 2/3 | reward 0.200 | loss 0.500 | 512.0 samples/s | ETA ")


def test_progress_rewrites_one_line_on_a_terminal(tmp_path):
    text = run_logger(tmp_path, n_steps=3, stream=TTY(), plot=False)
    assert text.count("\r") == 3 and text.endswith("\n") and text.count("\n") == 1
    assert "\rstep 3/3 | reward 0.300" in text


def test_format_progress():
    assert format_progress(5, None, {}) == "step 5"
    metrics = {"rollout/reward_mean": 0.5, "eval/accuracy": 0.75, "throughput/samples_per_s": 12.34}
    line = format_progress(10, 100, metrics, seconds_per_step=2.0)
    assert line == "step 10/100 | reward 0.500 | acc 0.750 | 12.3 samples/s | ETA 3m00s"
    assert format_progress(10, 100, metrics) == "step 10/100 | reward 0.500 | acc 0.750 | 12.3 samples/s"


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now


@pytest.mark.parametrize("first", [1, 21])  # a fresh run, and one recovered at step 21
def test_eta_leaves_out_the_first_step(tmp_path, monkeypatch, first):
    """The first step logged carries the start-up (a cold SGLang start compiles for minutes): the
    ETA starts at the next step, from the pace since the first one."""
    import areal.utils.stats_logger as stats_logger

    clock, stream = _Clock(), io.StringIO()
    monkeypatch.setattr(stats_logger, "time", clock)
    with StatsLogger(tmp_path, total_steps=40, progress_stream=stream, progress_every_s=0, plot=False) as stats:
        clock.now += 300.0  # start-up and the first step
        stats.log(first, step_metrics(first))
        for step in (first + 1, first + 2):
            clock.now += 5.0
            stats.log(step, step_metrics(step))
    lines = stream.getvalue().splitlines()
    assert "ETA" not in lines[0]
    assert lines[1].endswith(f"ETA {(40 - first - 1) * 5 // 60}m{(40 - first - 1) * 5 % 60:02d}s")
    assert lines[2].endswith(f"ETA {(40 - first - 2) * 5 // 60}m{(40 - first - 2) * 5 % 60:02d}s")


def test_missing_required_keys_warn_once_and_tensorboard_absence_is_said(tmp_path, caplog):
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401

        has_tb = True
    except ImportError:
        has_tb = False
    with caplog.at_level(logging.INFO, logger="areal.utils.stats_logger"):
        with StatsLogger(tmp_path, progress=False, plot=False) as stats:
            stats.log(1, {"rollout/reward_mean": 0.1})
            stats.log(2, {"rollout/reward_mean": 0.2})
    warnings = [r for r in caplog.records if "lack" in r.getMessage()]
    assert len(warnings) == 1 and "train/loss" in warnings[0].getMessage()
    if has_tb:
        assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    else:
        assert any("tensorboard is not installed" in r.getMessage() for r in caplog.records)


def test_log_after_close_is_an_error(tmp_path):
    stats = StatsLogger(tmp_path, progress=False, plot=False, tensorboard=False)
    stats.close()
    with pytest.raises(RuntimeError, match="closed"):
        stats.log(1, {})


def test_cli_replots_a_run(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    run_logger(tmp_path, n_steps=3, plot=False)
    out = tmp_path / "again.png"
    assert main([str(tmp_path), "--out", str(out)]) == 0
    assert out.read_bytes().startswith(PNG_MAGIC)
    assert main([str(tmp_path / "nope")]) == 2
    assert "metrics.jsonl does not exist" in capsys.readouterr().err


def test_drop_rows_from_keeps_earlier_steps_and_appends_after(tmp_path):
    stats = StatsLogger(tmp_path, tensorboard=False, plot=False, progress=False)
    for step in range(4):
        stats.log(step, {"rollout/reward_mean": 0.1 * step})
    assert stats.drop_rows_from(2) == 2
    stats.log(2, {"rollout/reward_mean": 0.5})
    stats.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2] and rows[-1]["rollout/reward_mean"] == 0.5


def _wandb_records(run_file):
    """The protobuf records of an offline run's .wandb file (W&B's append-only log: a 7-byte
    header, then 32 KiB blocks of records, each with a 7-byte header: crc32, length, type; a
    record may span blocks as FIRST / MIDDLE / LAST pieces)."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data, block = run_file.read_bytes(), 32768
    assert data[:4] == b":W&B"
    pos, pieces = 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # the rest of a block too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        pieces += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            record = pb.Record()
            record.ParseFromString(pieces)
            pieces = b""
            yield record


def _wait_for_wandb_writer(deadline_s: float = 60.0) -> None:
    """Wait until wandb's service process, which writes the run's .wandb file, has exited.

    run.finish() (called by StatsLogger.close) returns once the run's exit record was handled,
    but the service closes and flushes the run's file only after it, on its own time: reading
    the file at once sometimes found no run record. wandb.teardown() tells the service to shut
    down and waits for its process to end, so every record is on disk when it returns."""
    import threading

    import wandb

    done = threading.Thread(target=wandb.teardown, name="wandb-teardown", daemon=True)
    done.start()
    done.join(deadline_s)
    if done.is_alive():
        raise TimeoutError(
            f"wandb's service process (which writes offline-run-*/run-*.wandb) had not exited "
            f"{deadline_s:.0f} s after wandb.teardown(); its file may be incomplete"
        )


def test_wandb_offline_gets_the_same_metric_names_and_values(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    settings = {"mode": "offline", "project": "areal-test", "name": "trial7", "tags": ["ci"]}
    with StatsLogger(
        tmp_path / "run",
        progress=False,
        plot=False,
        tensorboard=False,
        wandb=settings,
        run_config={"actor": {"eps_clip": 0.2}},
    ) as stats:
        stats.log(0, {"rollout/reward_mean": None, "eval/accuracy": 0.25, "note": "text"})
        for step in (1, 2):
            stats.log(step, step_metrics(step))
    _wait_for_wandb_writer()
    [run_file] = list((tmp_path / "wandb_dir").glob("wandb/offline-run-*/run-*.wandb"))
    rows, run = {}, None
    for record in _wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            rows[record.history.step.num] = {k: v for k, v in items.items() if not k.startswith("_")}
        elif kind == "run":
            run = record.run
    assert run.project == "areal-test" and run.display_name == "trial7" and list(run.tags) == ["ci"]
    config = {i.key: json.loads(i.value_json) for i in run.config.update}
    assert config["actor"] == {"eps_clip": 0.2}
    jsonl = {r["step"]: r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())}
    assert sorted(rows) == [0, 1, 2]
    assert rows[0] == {"eval/accuracy": 0.25}  # null and text values are left out, as for TensorBoard
    for step in (1, 2):  # every number of metrics.jsonl, under its name, at its step
        want = {k: v for k, v in jsonl[step].items() if k != "step" and isinstance(v, (int, float))}
        assert rows[step] == pytest.approx(want)
        assert rows[step]["train/loss"] == pytest.approx(1.0 / step)
        assert rows[step]["throughput/samples_per_s"] == pytest.approx(512.0)


def test_wandb_enabled_without_the_package_names_the_key(tmp_path, monkeypatch):
    import sys

    from areal.config import ConfigError

    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now raises ImportError
    with pytest.raises(ConfigError, match="stats_logger.wandb.mode") as e:
        StatsLogger(tmp_path, progress=False, plot=False, tensorboard=False, wandb={"mode": "online"})
    assert "pip install wandb" in str(e.value) and "stats_logger.wandb.mode=disabled" in str(e.value)
    StatsLogger(tmp_path, progress=False, plot=False, tensorboard=False, wandb={"mode": "disabled"}).close()


def test_a_logged_standard_error_is_drawn_as_a_band_around_its_metric():
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from areal.utils.plot import _error_band

    records = [{"step": 0, "eval/accuracy": 0.2, "eval/accuracy_se": 0.03}, {"step": 5, "eval/accuracy": 0.6}]
    ax = Figure().subplots()
    _error_band(ax, records, "eval/accuracy", {0: 0.2, 5: 0.6}, "C1")
    (band,) = ax.collections  # over the steps that logged both: step 0 only
    ys = band.get_paths()[0].vertices[:, 1]
    assert min(ys) == pytest.approx(0.17) and max(ys) == pytest.approx(0.23)
    _error_band(ax, records, "rollout/reward_mean", {}, "C0")  # no error logged: nothing drawn
    assert len(ax.collections) == 1
