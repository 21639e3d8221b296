"""Time the front door: compose, validate and plan, in-process and as a whole CLI call.

    python scripts/bench_cli.py [--config gsm8k_grpo.yaml] [--repeat 5] [--out bench_cli.json]

Goal (2-core machine): `areal-launch --config gsm8k_grpo.yaml --dry-run` under 1.5 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def _in_process(config: str) -> dict[str, float]:
    t0 = time.perf_counter()
    from areal.config import validate_config
    from areal.infra.host import detect_host_facts
    from launcher.compose import compose
    from launcher.plan import make_plan

    t1 = time.perf_counter()
    raw = compose(config)
    t2 = time.perf_counter()
    cfg = validate_config(raw)
    t3 = time.perf_counter()
    make_plan(cfg, detect_host_facts())
    t4 = time.perf_counter()
    return {"import_s": t1 - t0, "compose_s": t2 - t1, "validate_s": t3 - t2, "plan_s": t4 - t3}


def _whole_cli(config: str, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "launcher.cli", "--config", config, "--dry-run"], check=True, capture_output=True
        )
        times.append(time.perf_counter() - t)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="gsm8k_grpo.yaml")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    result = _in_process(args.config)
    cli = _whole_cli(args.config, args.repeat)
    result.update(cli_dry_run_median_s=statistics.median(cli), cli_dry_run_max_s=max(cli), repeat=args.repeat)
    text = json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
