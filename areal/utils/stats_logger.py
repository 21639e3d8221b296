"""Per-step training metrics: metrics.jsonl, TensorBoard, a console progress line, a PNG.

The trainer (rank 0 only) makes one `StatsLogger(run_dir, total_steps=...)` and calls
`.log(step, metrics)` once per step and `.close()` at the end:

- `{run_dir}/metrics.jsonl` gets one JSON object per step, flushed at once so a crashed run
  keeps every finished step. A later run in the same folder appends (`earlier_steps` lists the
  rows it found; a fresh trainer says so, a recovered one drops the steps it redoes). The
  run-directory contract (DESIGN.md) expects at least
  `REQUIRED_KEYS`; a missing one is warned about once, not fatal, since inference-only runs
  have no loss.
- TensorBoard scalars under `{run_dir}/tensorboard` when `torch.utils.tensorboard` (or
  tensorboardX) works; otherwise one INFO line says so.
- Weights & Biases (stats_logger.wandb.mode online or offline): the same numeric metrics under
  the same names, at the same step; offline runs go under `{run_dir}/wandb` (or $WANDB_DIR) for a
  later `wandb sync`. wandb is optional (`pip install wandb`) and imported only when enabled.
- A one-line progress display on stderr (`\\r`-updated on a terminal; in a log file, a full line
  at most every `progress_every_s` seconds).
- `{run_dir}/metrics.png` on close (see `areal.utils.plot`).

Throughput: pass `throughput/samples_per_s`, or `rollout/n_samples` with `timing/step_s` and
the logger derives it.

    python -m areal.utils.stats_logger RUN_DIR [--out PNG]     # re-plot a run's metrics
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from areal.utils.plot import LOSS_KEY, REWARD_KEY, THROUGHPUT_KEY, plot_metrics

logger = logging.getLogger(__name__)

REQUIRED_KEYS = ("step", "epoch", "weight_version", REWARD_KEY, LOSS_KEY, "timing/step_s")
N_SAMPLES_KEY = "rollout/n_samples"
STEP_TIME_KEY = "timing/step_s"
ACCURACY_KEY = "eval/accuracy"


def accuracy_standard_error(accuracy: float, n: int) -> float:
    """The binomial standard error of a pass rate over n problems, sqrt(p (1 - p) / n).

    It says how far one evaluation can land from the model's true accuracy by the draw of the
    problems alone: 0.031 at p = 0.75 over 200 problems, 0.019 over 500.
    """
    return (accuracy * (1.0 - accuracy) / n) ** 0.5 if n > 0 else 0.0


def to_json_value(value: Any) -> Any:
    """A JSON-safe form: tensor/numpy scalars become numbers, NaN/inf become null (strict JSON)."""
    if hasattr(value, "item") and callable(value.item):
        try:
            value = value.item()
        except (ValueError, RuntimeError):  # a multi-element tensor/array: keep it as a list
            return value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [to_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_json_value(v) for k, v in value.items()}
    return str(value)


def with_throughput(metrics: dict) -> dict:
    """`metrics` plus samples/s derived from n_samples and step time, when not given."""
    if THROUGHPUT_KEY in metrics:
        return metrics
    n, dt = metrics.get(N_SAMPLES_KEY), metrics.get(STEP_TIME_KEY)
    if isinstance(n, (int, float)) and isinstance(dt, (int, float)) and dt > 0:
        return {**metrics, THROUGHPUT_KEY: n / dt}
    return metrics


def _fmt_duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def format_progress(step: int, total_steps: int | None, metrics: dict, seconds_per_step: float | None = None) -> str:
    """The progress line, e.g. `step 12/450 | reward 0.532 | acc 0.610 | 256.0 samples/s | ETA 5m10s`;
    the ETA is the steps left at `seconds_per_step` (none without it)."""
    parts = [f"step {step}/{total_steps}" if total_steps else f"step {step}"]
    for key, label in ((REWARD_KEY, "reward"), (ACCURACY_KEY, "acc"), (LOSS_KEY, "loss")):
        value = metrics.get(key)
        if isinstance(value, (int, float)):
            parts.append(f"{label} {value:.3f}")
    rate = metrics.get(THROUGHPUT_KEY)
    if isinstance(rate, (int, float)):
        parts.append(f"{rate:.1f} samples/s")
    if total_steps and seconds_per_step is not None:
        parts.append(f"ETA {_fmt_duration(seconds_per_step * max(total_steps - step, 0))}")
    return " | ".join(parts)


class ProgressLine:
    """One status line: rewritten in place on a terminal, printed now and then in a log file."""

    def __init__(self, stream: TextIO, every_s: float):
        self.stream = stream
        self.every_s = every_s
        self.is_tty = bool(getattr(stream, "isatty", lambda: False)())
        self._last_print = -math.inf
        self._width = 0

    def update(self, text: str, final: bool = False) -> None:
        if self.is_tty:
            self.stream.write("\r" + text.ljust(self._width))
            self._width = max(self._width, len(text))
        elif final or time.monotonic() - self._last_print >= self.every_s:
            self.stream.write(text + "\n")
            self._last_print = time.monotonic()
        self.stream.flush()

    def finish(self) -> None:
        """End the in-place line so later output starts on a fresh one."""
        if self.is_tty and self._width:
            self.stream.write("\n")
            self.stream.flush()


def _open_tensorboard(log_dir: Path):
    """A SummaryWriter, or None (with one INFO line) when no TensorBoard writer is installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            logger.info(
                "tensorboard is not installed (pip install tensorboard); "
                "metrics go to metrics.jsonl and metrics.png only"
            )
            return None
    return SummaryWriter(log_dir=str(log_dir))


WANDB_MODE_KEY = "stats_logger.wandb.mode"


def _open_wandb(settings: dict, run_dir: Path, run_config: dict | None):
    """A wandb run for stats_logger.wandb `settings` (mode, project, entity, name, group, tags),
    or None when the mode is disabled. wandb is imported here only: it is an optional dependency."""
    mode = settings.get("mode", "disabled")
    if mode == "disabled":
        return None
    try:
        import wandb
    except ImportError:
        from areal.config.errors import ConfigError, ConfigIssue

        raise ConfigError(
            [
                ConfigIssue(
                    WANDB_MODE_KEY,
                    mode,
                    "the wandb package is not installed",
                    f"pip install wandb (or the project's [wandb] extra), or set {WANDB_MODE_KEY}=disabled",
                )
            ]
        ) from None
    folder = Path(os.environ.get("WANDB_DIR") or run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return wandb.init(
        mode=mode,
        project=settings.get("project"),
        entity=settings.get("entity"),
        name=settings.get("name"),
        group=settings.get("group"),
        tags=list(settings.get("tags") or []) or None,
        dir=str(folder),
        config=run_config,
        reinit="create_new",
    )


class StatsLogger:
    """Writes each step's metrics to metrics.jsonl, TensorBoard, W&B and the console (module docstring)."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        tensorboard: bool = True,
        plot: bool = True,
        progress: bool = True,
        total_steps: int | None = None,
        progress_stream: TextIO | None = None,
        progress_every_s: float = 10.0,
        wandb: dict | None = None,
        run_config: dict | None = None,
    ):
        """`wandb`: the stats_logger.wandb settings as a dict (None or mode 'disabled': no W&B);
        `run_config`: the run's resolved config, stored with the W&B run."""
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.plot_path = self.run_dir / "metrics.png"
        self.total_steps = total_steps
        self.plot = plot
        self.earlier_steps = self._steps_logged()  # an earlier run's rows in this folder, if any
        self._file = self.metrics_path.open("a", encoding="utf-8")
        self._tb = _open_tensorboard(self.run_dir / "tensorboard") if tensorboard else None
        self._wandb = _open_wandb(wandb or {}, self.run_dir, run_config)
        self._progress = ProgressLine(progress_stream or sys.stderr, progress_every_s) if progress else None
        self._pace_origin: tuple[int, float] | None = None  # (step, time) of the first step logged here
        self._warned_missing = False
        self._closed = False

    def _steps_logged(self) -> list[int]:
        """The steps of the rows metrics.jsonl already holds, in file order."""
        if not self.metrics_path.exists():
            return []
        lines = self.metrics_path.read_text(encoding="utf-8").splitlines()
        return [step for step in map(_row_step, lines) if step is not None]

    def drop_rows_from(self, step: int) -> int:
        """Remove rows of steps >= `step` (a recovered run redoes them); returns how many went."""
        self._file.close()
        lines = self.metrics_path.read_text(encoding="utf-8").splitlines(keepends=True)
        kept = [line for line in lines if _row_step(line) is None or _row_step(line) < step]
        tmp = self.metrics_path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(kept), encoding="utf-8")
        os.replace(tmp, self.metrics_path)
        self._file = self.metrics_path.open("a", encoding="utf-8")
        return len(lines) - len(kept)

    def log(self, step: int, metrics: dict) -> dict:
        """Record one step's metrics; returns the record as written (with derived keys)."""
        if self._closed:
            raise RuntimeError(f"StatsLogger for {self.run_dir} is closed; make a new one to log more")
        record = {"step": int(step), **{k: to_json_value(v) for k, v in metrics.items() if k != "step"}}
        record = with_throughput(record)
        self._check_required(record)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        self._write_tensorboard(step, record)
        self._write_wandb(step, record)
        if self._progress is not None:
            final = self.total_steps is not None and step >= self.total_steps
            self._progress.update(format_progress(step, self.total_steps, record, self._pace(step)), final=final)
        return record

    def _pace(self, step: int) -> float | None:
        """Seconds per step since the first step this logger saw. That step is left out: it carries
        the start-up (servers' warm-up, kernel compiles) and, after a recovery, every step before it;
        so the first line has no ETA."""
        now = time.monotonic()
        if self._pace_origin is None:
            self._pace_origin = (step, now)
        origin_step, origin_t = self._pace_origin
        return (now - origin_t) / (step - origin_step) if step > origin_step else None

    def _check_required(self, record: dict) -> None:
        missing = [k for k in REQUIRED_KEYS if k not in record]
        if missing and not self._warned_missing:
            self._warned_missing = True
            logger.warning(
                "metrics at step %s lack %s, which metrics.jsonl readers expect (warned once)", record["step"], missing
            )

    def _write_tensorboard(self, step: int, record: dict) -> None:
        if self._tb is None:
            return
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self._tb.add_scalar(key, value, step)

    def _write_wandb(self, step: int, record: dict) -> None:
        if self._wandb is None:
            return
        scalars = {
            k: v for k, v in record.items() if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        self._wandb.log(scalars, step=int(step))

    def close(self) -> Path | None:
        """Flush and close everything, then draw metrics.png (when plotting is on); returns its path."""
        if self._closed:
            return None
        self._closed = True
        if self._progress is not None:
            self._progress.finish()
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
        return self._plot() if self.plot else None

    def _plot(self) -> Path | None:
        try:
            return plot_metrics(self.metrics_path, self.plot_path)
        except ImportError as e:
            logger.info("no metrics.png: %s", e)
            return None

    def __enter__(self) -> "StatsLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Re-plot a run's metrics.jsonl as a PNG.")
    parser.add_argument("run_dir", help="run directory holding metrics.jsonl")
    parser.add_argument("--out", help="output PNG (default RUN_DIR/metrics.png)")
    args = parser.parse_args(argv)
    metrics = Path(args.run_dir) / "metrics.jsonl"
    if not metrics.is_file():
        print(f"error: {metrics} does not exist; pass the run directory that holds metrics.jsonl", file=sys.stderr)
        return 2
    out = plot_metrics(metrics, args.out or Path(args.run_dir) / "metrics.png")
    if out is None:
        print(f"error: {metrics} has no plottable metrics", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())


def _row_step(line: str) -> int | None:
    try:
        step = json.loads(line).get("step")
    except (json.JSONDecodeError, AttributeError):
        return None
    return step if isinstance(step, int) else None
