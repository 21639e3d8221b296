#!/usr/bin/env bash
# Run several variants of the CPU demo side by side (a many-core machine) and collect their
# metrics, to choose the demo's hyperparameters by measured learning curves.
#   OUT=/tmp/tune bash scripts/dev/tune_demo.sh STEPS < variants.txt
# where each line of variants.txt is `NAME hydra.override=value ...` (one run per line).
set -u
steps=${1:-400}
out=${OUT:-/tmp/tune}
mkdir -p "$out"
export OMP_NUM_THREADS=1 AREAL_CACHE=$out/cache
run() {  # name, extra overrides...
  local name=$1; shift
  timeout "${RUN_TIMEOUT:-900}" python -m launcher.cli --config tiny_arith_cpu.yaml cluster.fileroot=$out/runs experiment_name=$name \
    total_train_steps=$steps evaluator.freq_steps=${EVAL_FREQ:-100} "$@" > "$out/$name.log" 2>&1
  echo "$name rc=$?" >> "$out/status.txt"
}
i=0
while read -r name overrides; do
  [ -z "$name" ] && continue
  # shellcheck disable=SC2086
  run "$name" launcher.server_base_port=$((31000 + 10 * i)) launcher.trainer_master_port=$((29600 + i)) $overrides &
  i=$((i + 1))
  sleep 2
done
wait
python scripts/dev/tune_demo_summary.py "$out"
