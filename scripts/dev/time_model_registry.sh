#!/usr/bin/env bash
# What SGLang's model registry costs a server start, on the device, by hand after the kit's
# `device_stage.sh start` (source /tmp/env.sh first). Measured once (docs/reliability.md, 2026-12-05:
# 12.3-12.7 s with every module, 11.6-12.7 s restricted). A server's scheduler builds sglang.srt.models.registry.ModelRegistry,
# which imports every module of sglang/srt/models (about 210 in 0.5.16) except those named in
# SGLANG_DISABLED_MODEL_ARCHS. Times `import sglang.srt.models.registry` in a fresh interpreter
# twice with every module and twice with only those that name the architectures the project's
# models use (LlamaForCausalLM: SmolLM2; Qwen2ForCausalLM: the 0.5B and 1.5B shapes) or SGLang's
# transformers fallback; the difference is what restricting the registry would save each start.
set -u
models=$(python3 -c "import importlib.util as u; print(list(u.find_spec('sglang').submodule_search_locations)[0] + '/srt/models')")
all=$(cd "$models" && ls ./*.py | sed 's|^\./||; s|\.py$||')
keep=$(cd "$models" && grep -lwE 'LlamaForCausalLM|Qwen2ForCausalLM|TransformersForCausalLM' ./*.py | sed 's|^\./||; s|\.py$||')
skip=$(grep -vxF -f <(echo "$keep") <<<"$all" | paste -sd, -)
echo "model registry: $(wc -l <<<"$all") modules, $(wc -l <<<"$keep") name the archs: $(echo $keep)"
for run in 1 2; do
  for variant in all restricted; do
    t0=$EPOCHREALTIME
    if [ $variant = all ]; then
      python3 -c "import sglang.srt.models.registry" >/dev/null 2>&1
    else
      SGLANG_DISABLED_MODEL_ARCHS=$skip python3 -c "import sglang.srt.models.registry" >/dev/null 2>&1
    fi
    rc=$?
    echo "import sglang.srt.models.registry, $variant modules, run $run: rc $rc, $(awk "BEGIN {printf \"%.1f\", $EPOCHREALTIME - $t0}") s"
  done
done
