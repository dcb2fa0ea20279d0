#!/usr/bin/env bash
# Keeps the bench_attention_gpu that build-gpu holds now as variant NAME (stripped, under
# build-gpu/variants/NAME/) and repacks build-gpu/variants.tar.xz, which scripts/gpu_variants.sh
# times on the GPU machine: build one version of a kernel (a commit, an ablation patch), snapshot
# it, build the next, snapshot it, then compare them all in one device call.
#
#   scripts/snapshot_variant.sh base      # after `ninja -C build-gpu bench_attention_gpu`
#   FROM=path/to/bench_attention_gpu scripts/snapshot_variant.sh old   # a binary kept elsewhere
set -euo pipefail
cd "$(dirname "$0")/.."
name="${1:?usage: scripts/snapshot_variant.sh NAME}"
src="${FROM:-build-gpu/bench_attention_gpu}"
[ -x "$src" ] || { echo "no executable at $src (build bench_attention_gpu first)" >&2; exit 1; }
mkdir -p "build-gpu/variants/$name"
strip -o "build-gpu/variants/$name/bench_attention_gpu" "$src"
# The commit of the checkout the binary was built in (FROM may be another worktree's build;
# a binary kept outside any checkout says "unknown").
repo="$(dirname "$src")"
if git -C "$repo" rev-parse --short HEAD >/dev/null 2>&1; then
  { git -C "$repo" rev-parse --short HEAD; git -C "$repo" diff --quiet HEAD -- || echo dirty; } |
    paste -sd' ' >"build-gpu/variants/$name/GIT_COMMIT"
else
  echo unknown >"build-gpu/variants/$name/GIT_COMMIT"
fi
# Versions of one binary differ in a few kernels: xz's largest dictionary (-9e) packs each after
# the first into little (five variants: 7.5 MB, against 19 MB at the default level).
# Packed into a file of its own, checked, then moved into place: two snapshots at once must not
# interleave their writes into one archive (session 50's came out corrupt that way).
pack="$(mktemp build-gpu/variants.tar.xz.XXXXXX)"
tar -C build-gpu -cf - variants | xz "${XZ_LEVEL:--9e}" -T2 >"$pack"
xz -t "$pack" || { rm -f "$pack"; echo "the packed variants do not check (xz -t)" >&2; exit 1; }
mv "$pack" build-gpu/variants.tar.xz
echo "variant $name from $src; build-gpu/variants.tar.xz: $(du -h build-gpu/variants.tar.xz | cut -f1)" \
  "($(ls build-gpu/variants | tr '\n' ' '))"
