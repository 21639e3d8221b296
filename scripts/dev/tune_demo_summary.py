"""Summarise scripts/dev/tune_demo.sh runs: reward every 25 steps, eval accuracy, mean step time.

python scripts/dev/tune_demo_summary.py OUT_DIR
"""

import json
import pathlib
import sys

out = pathlib.Path(sys.argv[1])
summary = {}
for m in sorted((out / "runs").glob("*/demo/metrics.jsonl")):
    rows = [json.loads(line) for line in m.read_text().splitlines()]
    steps = [r for r in rows if r.get("step", 0) > 0]
    curve = {r["step"]: round(r["rollout/reward_mean"], 3) for r in steps if r["step"] % 25 == 0}
    evals = {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
    summary[m.parts[-3]] = {
        "reward": curve,
        "eval": evals,
        "step_s": round(sum(r["timing/step_s"] for r in steps) / max(len(steps), 1), 3),
    }
(out / "summary.json").write_text(json.dumps(summary, indent=1))
print(json.dumps(summary, indent=1))
