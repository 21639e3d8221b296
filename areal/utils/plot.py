"""A PNG of a run's training curves, drawn from its metrics.jsonl.

Panels: reward (with eval accuracy/reward when present), train loss (when present), and
throughput in samples/s. Uses matplotlib's object API with the Agg canvas, never pyplot, so it
neither needs a display nor changes the backend of a process that already uses matplotlib.

    python -m areal.utils.stats_logger RUN_DIR        # re-plot RUN_DIR/metrics.png
"""

from __future__ import annotations

import json
import math
from pathlib import Path

REWARD_KEY = "rollout/reward_mean"
LOSS_KEY = "train/loss"
SE_SUFFIX = "_se"  # a standard error logged beside its metric (eval/accuracy_se), drawn as a band
THROUGHPUT_KEY = "throughput/samples_per_s"


def read_metrics(metrics_jsonl: str | Path) -> list[dict]:
    """The records of a metrics.jsonl; a truncated last line (a run killed mid-write) is skipped."""
    records = []
    for line in Path(metrics_jsonl).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def _series(records: list[dict], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of the records that carry a finite number under `key`."""
    xs, ys = [], []
    for i, rec in enumerate(records):
        value = rec.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            xs.append(rec.get("step", i))
            ys.append(value)
    return xs, ys


def latest_per_step(records: list[dict]) -> list[dict]:
    """One record per step, the last one logged, in step order. metrics.jsonl is appended to:
    a run started again in the same run directory logs its steps from 1 once more, and a
    recovered one repeats the steps after its checkpoint; the curves show what came last."""
    by_step: dict[int, dict] = {}
    for rec in records:
        if isinstance(rec.get("step"), int):
            by_step[rec["step"]] = rec
    return [by_step[step] for step in sorted(by_step)]


def _panels(records: list[dict]) -> list[tuple[str, list[str]]]:
    """(title, keys) for each panel that has data: reward/eval, loss, throughput."""
    keys = {k for rec in records for k in rec}
    reward_keys = [REWARD_KEY] + sorted(
        k for k in keys if k.startswith("eval/") and ("accuracy" in k or "reward" in k) and not k.endswith(SE_SUFFIX)
    )
    panels = [("reward", reward_keys), ("train loss", [LOSS_KEY]), ("throughput (samples/s)", [THROUGHPUT_KEY])]
    return [(title, ks) for title, ks in panels if any(_series(records, k)[0] for k in ks)]


def _error_band(ax, records: list[dict], key: str, by_step: dict, color) -> None:
    """A band of one standard error around `key` (by_step: its values by step) where the run
    logged `key + SE_SUFFIX` (eval/accuracy_se: the spread from the draw of the held-out problems)."""
    steps_se, se = _series(records, key + SE_SUFFIX)
    if not steps_se:
        return
    xs = [x for x in steps_se if x in by_step]
    errors = dict(zip(steps_se, se))
    ax.fill_between(
        xs, [by_step[x] - errors[x] for x in xs], [by_step[x] + errors[x] for x in xs], color=color, alpha=0.2, lw=0
    )


def plot_metrics(metrics_jsonl: str | Path, out_png: str | Path) -> Path | None:
    """Draw the curves of `metrics_jsonl` into `out_png`; None when there is nothing to draw.

    Raises ImportError naming the fix when matplotlib is missing.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("plotting metrics needs matplotlib: pip install matplotlib") from None
    records = latest_per_step(read_metrics(metrics_jsonl))
    panels = _panels(records)
    if not panels:
        return None
    fig = Figure(figsize=(6.5, 2.6 * len(panels)), layout="constrained")
    FigureCanvasAgg(fig)
    for ax, (title, keys) in zip(fig.subplots(len(panels), 1, squeeze=False)[:, 0], panels):
        for key in keys:
            xs, ys = _series(records, key)
            if xs:
                line = ax.plot(xs, ys, marker="." if len(xs) < 50 else None, label=key)[0]
                _error_band(ax, records, key, dict(zip(xs, ys)), line.get_color())
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    out_png = Path(out_png)
    fig.savefig(out_png, dpi=100)
    return out_png
