"""Run the CPU demo over several seeds and report the spread of its result.

    python scripts/demo_seeds.py --seeds 10 --out demo_seeds.json          # one run after another
    python scripts/demo_seeds.py --seeds 1 2 7 -- algo=dapo                # chosen seeds, overrides
    python scripts/demo_seeds.py --seeds 8 --jobs 8 --out s.json           # many cores: runs at once

Each run is `areal-launch --config tiny_arith_cpu.yaml seed=S` (plus the overrides after `--`) in
its own run directory. Per run it records the final held-out greedy accuracy (`eval/accuracy` at
the last step), the best one, the training reward of the first and last 10 steps and the wall
time of the whole launch (model and tokenizer building included, package setup not). It prints
the minimum, median and maximum accuracy and wall time, and how many runs reached --goal.
`train_s` is the training loop alone (the sum of the steps' `timing/step_s`), setup excluded:
process starts, building and loading the model, the first evaluation.
With --jobs > 1 runs share the machine, so their wall times are not the demo's on 2 cores.
Exit status 0 when every run finished, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from areal.utils.plot import latest_per_step, read_metrics

CONFIG = "tiny_arith_cpu.yaml"
EXPERIMENT = "tiny_arith_cpu"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog="Arguments after `--` are Hydra overrides for every run."
    )
    p.add_argument(
        "--seeds", type=int, nargs="+", default=[10], help="one number N (seeds 1..N) or the list of seeds to run"
    )
    p.add_argument("--jobs", type=int, default=1, help="runs at once (distinct ports); 1 on a 2-core machine")
    p.add_argument(
        "--first-slot",
        type=int,
        default=0,
        help="first port slot (20 server ports and one trainer port each): a second "
        "demo_seeds.py beside this one starts past this one's --jobs",
    )
    p.add_argument("--goal", type=float, default=0.9, help="the held-out accuracy a run should reach")
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "areal-demo-seeds"))
    p.add_argument("--timeout", type=float, default=1800, help="seconds before a run is stopped")
    p.add_argument("--out", default=None, help="where to write the JSON result")
    argv = sys.argv[1:] if argv is None else argv
    overrides: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, overrides = argv[:cut], argv[cut + 1 :]
    args = p.parse_args(argv)
    args.overrides = overrides
    args.seed_list = list(range(1, args.seeds[0] + 1)) if len(args.seeds) == 1 else args.seeds
    return args


def run_one(seed: int, slot: int, args: argparse.Namespace) -> dict:
    """One demo run; its metrics summarised (accuracy None when it logged no evaluation)."""
    root = Path(args.workdir) / f"seed{seed}"
    trial = f"seed{seed}"
    cmd = [
        sys.executable,
        "-m",
        "launcher.cli",
        "--config",
        CONFIG,
        f"seed={seed}",
        f"trial_name={trial}",
        f"cluster.fileroot={root}",
        f"launcher.server_base_port={31800 + 20 * slot}",
        f"launcher.trainer_master_port={29800 + slot}",
        *args.overrides,
    ]
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(root / "console.log", "w") as log:
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            rc = None
    wall = time.perf_counter() - t0
    result = {"seed": seed, "returncode": rc, "wall_s": round(wall, 1), **summarise(root / EXPERIMENT / trial)}
    print(json.dumps(result), flush=True)
    return result


def summarise(run_dir: Path) -> dict:
    """Accuracy and reward figures from a run's metrics.jsonl."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return {"accuracy": None, "best_accuracy": None, "steps": 0}
    rows = latest_per_step(read_metrics(path))  # a rerun in the same directory logs its steps again
    evals = [(r["step"], r["eval/accuracy"]) for r in rows if r.get("eval/accuracy") is not None]
    steps = [r for r in rows if r.get("step", 0) > 0]
    rewards = [r["rollout/reward_mean"] for r in steps if r.get("rollout/reward_mean") is not None]
    step_s = [r["timing/step_s"] for r in steps if r.get("timing/step_s")]
    return {
        "accuracy": round(evals[-1][1], 4) if evals else None,
        "best_accuracy": round(max(a for _, a in evals), 4) if evals else None,
        "eval_curve": {step: round(acc, 4) for step, acc in evals},
        "reward_first10": round(statistics.fmean(rewards[:10]), 3) if rewards else None,
        "reward_last10": round(statistics.fmean(rewards[-10:]), 3) if rewards else None,
        "steps": len(rewards),
        "mean_step_s": round(statistics.fmean(step_s), 3) if step_s else None,
        "train_s": round(sum(step_s), 1) if step_s else None,
    }


def spread(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)} if values else {}


def report(runs: list[dict], args: argparse.Namespace) -> dict:
    accs = [r["accuracy"] for r in runs if r["accuracy"] is not None]
    walls = [r["wall_s"] for r in runs]
    trains = [r["train_s"] for r in runs if r.get("train_s") is not None]
    return {
        "config": CONFIG,
        "overrides": args.overrides,
        "seeds": args.seed_list,
        "jobs": args.jobs,
        "date": time.strftime("%Y-%m-%d"),
        "cpus": os.cpu_count(),
        "accuracy": spread(accs),
        "wall_s": spread(walls),
        "train_s": spread(trains),
        "reached_goal": f"{sum(a >= args.goal for a in accs)}/{len(runs)} at >= {args.goal}",
        "runs": sorted(runs, key=lambda r: r["seed"]),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    jobs = max(args.jobs, 1)
    free_slots: queue.Queue[int] = queue.Queue()
    for slot in range(args.first_slot, args.first_slot + jobs):
        free_slots.put(slot)

    def run_in_free_slot(seed: int) -> dict:  # a slot's ports belong to one run at a time
        slot = free_slots.get()
        try:
            return run_one(seed, slot, args)
        finally:
            free_slots.put(slot)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        runs = list(pool.map(run_in_free_slot, args.seed_list))
    result = report(runs, args)
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    acc, wall, train = result["accuracy"], result["wall_s"], result["train_s"]
    print(
        f"accuracy min/median/max: {acc.get('min')} / {acc.get('median')} / {acc.get('max')}; "
        f"wall s min/median/max: {wall['min']} / {wall['median']} / {wall['max']}; "
        f"train s: {train.get('min')} / {train.get('median')} / {train.get('max')}; {result['reached_goal']}"
    )
    return 0 if all(r["returncode"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
