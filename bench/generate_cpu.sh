#!/usr/bin/env bash
# Generation speed on the CPU with and without the KV cache: gpt2-tiny trained 60 steps on the
# shipped Shakespeare, then 200 tokens after "ROMEO:" (seed 1, fp32) both ways; prints each
# run's statistics line and whether the two texts are the same.
# Usage: bench/generate_cpu.sh [build dir]   (run on an otherwise idle machine)
set -euo pipefail
cd "$(dirname "$0")/.."
cli="${1:-build}/flashtrain"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}"
"$cli" train --batch-size 8 --seq-len 64 --steps 60 --lr 3e-3 --warmup 10 --val-data '' \
  --sample-tokens 0 --device cpu --save "$tmp/ck.bin" >/dev/null
for mode in "" --no-kv-cache; do
  "$cli" generate --load "$tmp/ck.bin" --prompt "ROMEO:" --tokens 200 --seed 1 --device cpu \
    $mode >"$tmp/text$mode.txt"
done
cmp -s "$tmp/text.txt" "$tmp/text--no-kv-cache.txt" && echo "same text: yes" || echo "same text: NO"
