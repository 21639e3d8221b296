#!/usr/bin/env bash
# Adds ray to the device kit (run after ../shared/tools/sglang-device/build.sh): ray's wheel (75 MiB)
# is split in two by ../shared/tools/device-wheels; the first part (55 MiB) goes to .sgl-parts/r1, a
# call of its own, the second (21 MiB) rides with the kit's call 2 in .sgl-parts/c2 (29 MiB).
# scripts/dev/device_stage.sh start installs it when both parts are in /root/stash.
set -eu
../shared/tools/device-wheels --dir .raywhl ray >/dev/null
mkdir -p .sgl-parts/r1
rm -f .sgl-parts/r1/ray-* .sgl-parts/c2/ray-*
cp .raywhl-parts/ray-*.part00 .sgl-parts/r1/
cp .raywhl-parts/ray-*.part01 .sgl-parts/c2/
du -sh .sgl-parts/r1 .sgl-parts/c2
