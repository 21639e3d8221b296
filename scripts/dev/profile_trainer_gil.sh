#!/usr/bin/env bash
# Which thread of each trainer worker holds the GIL, and where (py-spy --gil), sampled for
# DURATION s once a worker has run DELAY s; start it in the background before the run:
#
#   scripts/dev/profile_trainer_gil.sh OUT_DIR [DELAY_S] [DURATION_S] & watcher=$!
#   python scripts/bench_e2e.py ...; kill $watcher
#   python scripts/dev/gil_share.py OUT_DIR/gil_[0-9]*.txt   # samples per thread, top stacks
#
# Sampling is --nonblocking (the process is never paused), so the run's figures stay usable.
# Workers are named by the order they appear (gil_1_PID.txt is the first run's trainer).
set -u
out=${1:?output directory}; delay=${2:-50}; duration=${3:-20}
mkdir -p "$out"
seen=" "; n=0
while true; do
  for pid in $(pgrep -f "areal.trainer.main --config"); do
    case "$seen" in *" $pid "*) continue ;; esac
    seen="$seen$pid "; n=$((n + 1))
    (sleep "$delay"
     echo "$(date +%T) pid $pid: $(tr '\0' ' ' </proc/$pid/cmdline | cut -c1-300)" >>"$out/gil_workers.txt"
     py-spy record --pid "$pid" --gil --threads --nonblocking --rate 100 --duration "$duration" \
       --format raw --output "$out/gil_${n}_$pid.txt" >"$out/gil_${n}_$pid.log" 2>&1) &
  done
  sleep 1
done
