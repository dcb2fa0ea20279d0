#!/usr/bin/env bash
# The main job: set up, build, and train the default model (gpt2-tiny) on the shipped
# Shakespeare shards, on the GPU when one is usable, else on the CPU. Extra arguments go to
# `flashtrain train`, e.g. scripts/train_demo.sh --steps 50 --model llama3-tiny
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
exec build/flashtrain train --model gpt2-tiny --batch-size 8 --seq-len 64 --steps 300 \
  --lr 3e-3 --warmup 20 --eval-every 50 --sample-every 100 --log build/demo.jsonl "$@"
