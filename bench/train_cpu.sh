#!/usr/bin/env bash
# CPU training throughput of the tiny presets at the demo's batch (8 x 64), fp32 and bf16,
# naive and flash attention: 30 steps each, the summary's mean tok/s over steps 2..30.
# Usage: bench/train_cpu.sh [build dir]   (run on an otherwise idle machine)
set -euo pipefail
cd "$(dirname "$0")/.."
cli="${1:-build}/flashtrain"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}"
printf '%-12s %-5s %-6s %10s %10s\n' model dtype attn "ms/step" "tok/s"
for model in gpt2-tiny llama3-tiny; do
  for dtype in fp32 bf16; do
    for attn in naive flash; do
      line=$("$cli" train --model "$model" --dtype "$dtype" --attention "$attn" --batch-size 8 \
        --seq-len 64 --steps 30 --val-data '' --sample-tokens 0 | grep '^steps ')
      ms=$(sed -E 's/.*\| ([0-9.]+) ms\/step.*/\1/' <<<"$line")
      tps=$(sed -E 's/.*\| ([0-9]+) tok\/s.*/\1/' <<<"$line")
      printf '%-12s %-5s %-6s %10s %10s\n' "$model" "$dtype" "$attn" "$ms" "$tps"
    done
  done
done
