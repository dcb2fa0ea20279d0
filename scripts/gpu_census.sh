#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, over binaries built by scripts/build_gpu.sh
# and carried as build-gpu/carry.tar.xz: Nsight Compute times every kernel launch of a short
# training run (and counts its DRAM bytes), then bench/kernel_census.py groups the launches of
# the last step by kernel. Writes $OUT/census_<tag>.csv (ncu's CSV) and census_<tag>.txt.
#
#   scripts/gpu_census.sh                                   # GPT-2 124M bf16, 16 x 1024
#   TAG=llama TRAIN_ARGS='--model llama3-1b --batch-size 4 --seq-len 2048' scripts/gpu_census.sh
#
# TRAIN_ARGS: the model and shape (default GPT-2's); the run adds --device cuda --dtype bf16
# --attention flash --steps 2 (DTYPE, ATTENTION override the two). NCU_ARGS (default
# --clock-control none: the clocks as the card runs them). The steps run without the CUDA graph
# (the same kernels; ncu then sees each launch). Kernels run one at a time under
# Nsight Compute: the census is kernel time, not the step's wall time. A GPT-2 step of ~450
# launches takes about a minute.
set -uo pipefail
out="${OUT:-gpu-out}"
mkdir -p "$out"
source scripts/gpu_env.sh || exit 1
export NCCL_NVLS_ENABLE=0
command -v ncu >/dev/null || { echo "ncu not found (Nsight Compute)"; exit 2; }
tag="${TAG:-gpt2}"
# shellcheck disable=SC2086
ncu ${NCU_ARGS:---clock-control none} --csv \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  --log-file "$out/census_$tag.csv" build-gpu/carry/flashtrain train --device cuda --val-data '' \
  --sample-tokens 0 --steps 2 --warmup 1 --lr 1e-4 --cuda-graph off --dtype "${DTYPE:-bf16}" \
  --attention "${ATTENTION:-flash}" ${TRAIN_ARGS:---model gpt2 --batch-size 16 --seq-len 1024} \
  >"$out/census_${tag}_run.log" 2>&1 || { echo "ncu failed: $out/census_${tag}_run.log"; exit 1; }
python3 bench/kernel_census.py "$out/census_$tag.csv" | tee "$out/census_$tag.txt"
