"""Throughput and phase times of finished runs, from their metrics.jsonl.

    python scripts/summarise_run.py RUN_A/metrics.jsonl RUN_B/metrics.jsonl --warmup 2 --out s.json

Per run, over the steps after --warmup: samples/s (samples over the summed step time), the
pipeline's samples/s (the same over the step time less the `eval` and `save` phases: held-out
evaluation and model saves come when the config asks, often only at the last step, where in a
12-step run they took 2.6 s of a 5 s step, 10% of the run's step time), trained
tokens/s (`rollout/tokens`, a step's prompt and generated tokens, over the same time; runs logged
before it existed fall back on `train/n_tokens`, which then counted the last PPO minibatch only),
the microseconds of training and of logprob recomputation per trained token, the CPU time of the
trainer's other threads over its training thread's during recomputation (the rollout client's
share of the GIL: `workflow.workers` moves the episodes out of the process), the mean seconds of
each timed phase (`timing/*_s`), of the weight update and of each memory hand-off (`handoff/*`), the
peak memory figures (`memory/*`, their maximum) and the last held-out accuracy. With two or more
runs it adds each run's samples/s and per-token train and recompute times over the first one's (an
agent recipe against the RLVR one: issue 37 asks for per-token times within 1.2x). This is how an
`areal-launch` recipe (rather than bench_e2e's random-weight shapes) is compared across schedules.

For learning it gives the first and last held-out accuracy with the last one's standard error
(`eval/accuracy_se`: about 0.03 over 200 problems, so a single evaluation cannot rank runs), the
mean of the last 3 evaluations and the mean training reward of the last 5 steps (what a recipe is
tuned on, leaving the held-out set alone), and how many of its weight updates met requests on the
servers (`weight_update/requests_in_flight` above 0; none means its pause mode never acted). --table
prints one markdown row per run with those figures. A step logged more than once (metrics.jsonl is
appended to: a run started again in the same directory, or one recovered from a checkpoint) counts
with its last record.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from areal.utils.plot import latest_per_step, read_metrics
from areal.utils.stats_logger import accuracy_standard_error

# phases a step may spend outside the rollout-train pipeline, when the config asks for them
_NOT_PIPELINE = ("eval", "save")


def summarise(path: Path, warmup: int) -> dict:
    rows = latest_per_step(read_metrics(path))  # a rerun or a recovery logs its steps again
    steps = [r for r in rows if r.get("step", 0) > warmup and r.get("timing/step_s")]
    if not steps:
        raise SystemExit(f"{path}: no training steps after --warmup {warmup}; lower it or check the run")
    samples = sum(r.get("rollout/n_samples", 0) for r in steps)
    seconds = sum(r["timing/step_s"] for r in steps)
    pipeline_seconds = seconds - sum(r.get(f"timing/{k}_s", 0.0) for r in steps for k in _NOT_PIPELINE)

    def mean_of(prefix: str) -> dict:
        keys = sorted({k for r in steps for k in r if k.startswith(prefix) and isinstance(r[k], (int, float))})
        return {k: round(statistics.fmean(r.get(k, 0.0) for r in steps), 4) for k in keys}

    tokens = sum(r.get("rollout/tokens", r.get("train/n_tokens", 0)) for r in steps)
    memory = sorted({k for r in steps for k in r if k.startswith("memory/")})
    evals = [r["eval/accuracy"] for r in rows if r.get("eval/accuracy") is not None]
    rewards = [r["rollout/reward_mean"] for r in rows if r.get("step", 0) > 0 and "rollout/reward_mean" in r]
    return {
        "metrics": str(path),
        "steps": len(steps),
        "warmup": warmup,
        "samples_per_s": round(samples / seconds, 3),
        "pipeline_samples_per_s": round(samples / pipeline_seconds, 3),
        "step_s": round(seconds / len(steps), 3),
        "trained_tokens_per_s": round(tokens / seconds, 1),
        "train_us_per_token": _per_token(steps, "timing/train_s", tokens),
        "recompute_us_per_token": _per_token(steps, "timing/recompute_logprob_s", tokens),
        "recompute_others_cpu_share": _cpu_share(steps, "recompute_logprob"),
        "phases_s": mean_of("timing/"),
        "handoff_s": mean_of("handoff/"),
        # the staleness bound per step: seconds it held episodes back, and with nothing running
        "bound_s": mean_of("rollout/bound_"),
        "weight_update_s": round(statistics.fmean(r.get("weight_update/seconds", 0.0) for r in steps), 4),
        "memory_gb_max": {k: round(max(r.get(k, 0.0) for r in steps), 3) for k in memory},
        "staleness_max": max(r.get("rollout/staleness_max", 0) for r in steps),
        "last_step": max(r.get("step", 0) for r in rows),
        "first_eval_accuracy": evals[0] if evals else None,
        "last_eval_accuracy": evals[-1] if evals else None,
        "last_eval_accuracy_se": _last_eval_se(rows),
        "eval_last3_mean": _mean_of_last(evals, 3),
        "reward_last5_mean": _mean_of_last(rewards, 5),
        "updates_with_requests": _updates_with_requests(rows),
    }


def _updates_with_requests(rows: list[dict]) -> list[int] | None:
    """[weight updates that met requests on the servers, weight updates counted]; None for runs
    that did not log weight_update/requests_in_flight."""
    counts = [r["weight_update/requests_in_flight"] for r in rows if "weight_update/requests_in_flight" in r]
    return [sum(c > 0 for c in counts), len(counts)] if counts else None


def _last_eval_se(rows: list[dict]) -> float | None:
    """The last evaluation's standard error (eval/accuracy_se; from eval/n for runs that predate it)."""
    evals = [r for r in rows if r.get("eval/accuracy") is not None]
    if not evals:
        return None
    last = evals[-1]
    if last.get("eval/accuracy_se") is not None:
        return round(last["eval/accuracy_se"], 4)
    return round(accuracy_standard_error(last["eval/accuracy"], last["eval/n"]), 4) if last.get("eval/n") else None


def _mean_of_last(values: list[float], n: int) -> float | None:
    """Mean of the last n values (of all of them when fewer), None for none."""
    return round(statistics.fmean(values[-n:]), 4) if values else None


def run_name(path: Path) -> str:
    """A run's name: its folder (the trial) for RUN/metrics.jsonl, else the file's stem."""
    return path.parent.name if path.name == "metrics.jsonl" else path.stem


def _of(pair: list[int] | None) -> str:
    return "-" if pair is None else f"{pair[0]} of {pair[1]}"


def _plus_minus(se: float | None) -> str:
    return "" if se is None else f" ± {se:.3f}"


def table(runs: list[dict]) -> str:
    """One markdown row per run: its learning and its speed."""

    def f(v, spec):
        return "-" if v is None else format(v, spec)

    lines = [
        "| run | last step | accuracy, first -> last | mean of last 3 evals | reward, last 5 steps | samples/s "
        "| updates with requests in flight |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in runs:
        lines.append(
            f"| {run_name(Path(r['metrics']))} | {r['last_step']} | {f(r['first_eval_accuracy'], '.3f')} -> "
            f"{f(r['last_eval_accuracy'], '.3f')}{_plus_minus(r.get('last_eval_accuracy_se'))} | "
            f"{f(r['eval_last3_mean'], '.3f')} | "
            f"{f(r['reward_last5_mean'], '.3f')} | {f(r['samples_per_s'], '.1f')} | "
            f"{_of(r.get('updates_with_requests'))} |"
        )
    return "\n".join(lines)


def _cpu_share(steps: list[dict], phase: str) -> float | None:
    """CPU seconds of the trainer's other threads over its training thread's during `phase`
    (cpu/<phase>_others_s over cpu/<phase>_main_s; None where the run did not log them). During
    recompute, which has no backward, the others are the rollout client: its share of the GIL."""
    main = sum(r.get(f"cpu/{phase}_main_s", 0.0) for r in steps)
    others = sum(r.get(f"cpu/{phase}_others_s", 0.0) for r in steps)
    return round(others / main, 3) if main else None


def _per_token(steps: list[dict], key: str, tokens: float) -> float | None:
    """Microseconds of phase `key` per trained token (None without token counts)."""
    return round(sum(r.get(key, 0.0) for r in steps) / tokens * 1e6, 2) if tokens else None


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("metrics", nargs="+", type=Path, help="metrics.jsonl files, the baseline first")
    p.add_argument("--warmup", type=int, default=2, help="first steps left out (start-up, first compile)")
    p.add_argument("--out", default=None)
    p.add_argument("--table", action="store_true", help="print a markdown table, one row per run, instead of JSON")
    args = p.parse_args(argv)
    runs = [summarise(path, args.warmup) for path in args.metrics]
    for run in runs[1:]:
        run["speedup_vs_first"] = round(run["samples_per_s"] / runs[0]["samples_per_s"], 3)
        run["pipeline_speedup_vs_first"] = round(run["pipeline_samples_per_s"] / runs[0]["pipeline_samples_per_s"], 3)
        for key in ("train_us_per_token", "recompute_us_per_token"):
            if run[key] and runs[0][key]:
                run[f"{key}_vs_first"] = round(run[key] / runs[0][key], 3)
    text = json.dumps(runs, indent=1)
    print(table(runs) if args.table else text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
