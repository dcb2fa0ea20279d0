#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, over binaries built by scripts/build_gpu.sh
# and carried as build-gpu/carry.tar.xz: one check-and-measure round of the training step's
# speed work. The CUDA layer, model and trainer tests, memcheck over the layer tests, the
# end-to-end rows of bench/gpu_train.sh beside torch.compile, our step profile of each model
# (`flashtrain train --profile 3`) and, with CENSUS=1, the kernel census of a GPT-2 step
# (scripts/gpu_census.sh). Everything goes under $OUT/step and is packed into $OUT/step.tgz: the
# device tool brings back at most 8 files of $OUT.
#
#   scripts/gpu_step.sh
#   ROWS="gpt2_bf16_b16_compile" PROFILES=gpt2 CENSUS=1 scripts/gpu_step.sh
#
# ROWS: bench/gpu_train.sh rows (default: GPT-2 and llama3-1b, each beside torch.compile);
# PROFILES: gpt2 and/or llama (default both); STEPS: timed steps of the rows (20).
# Prints the tests' summary lines, the rows and the profiles' norm/classifier/optimizer/step rows.
set -uo pipefail
real_out="${OUT:-gpu-out}"
export OUT="$real_out/step"
rm -rf "$OUT"
mkdir -p "$OUT"
source scripts/gpu_env.sh || exit 1
export NCCL_NVLS_ENABLE=0
{
  GPU_TESTS="test_core" GTEST_FILTER='*Cuda*' scripts/gpu_check.sh
  GPU_TESTS="test_nn" GTEST_FILTER='*Cuda*' scripts/gpu_check.sh
  GPU_TESTS="test_models" GTEST_FILTER='*Cuda*:*Packed*' scripts/gpu_check.sh
  GPU_TESTS="test_train" GTEST_FILTER='*Profile*:*Gpu*:*Cuda*' scripts/gpu_check.sh
  compute-sanitizer --tool memcheck --error-exitcode 9 build-gpu/carry/test_nn \
    --gtest_filter='*CudaFusedNorms*:*CudaLayers*:*CudaLinear*:*CudaAdamW*' 2>&1 |
    grep -E "FAILED  \]|ERROR SUMMARY" | tail -4
  compute-sanitizer --tool memcheck --error-exitcode 9 build-gpu/carry/test_core \
    --gtest_filter='*CudaGraph*' 2>&1 | grep -E "FAILED  \]|ERROR SUMMARY" | tail -4
} >"$OUT/tests.txt" 2>&1
grep -h "exit\|FAILED\|ERROR SUMMARY" "$OUT/tests.txt"
STEPS="${STEPS:-20}" RUNS="${ROWS:-gpt2_bf16_b16_compile llama1b_bf16_compile}" \
  bench/gpu_train.sh >"$OUT/train.txt" 2>&1
grep -h "^flashtrain\|tok_per_s" "$OUT/train.txt" | cut -c1-260
for model in ${PROFILES:-gpt2 llama}; do
  case "$model" in
    gpt2) shape="--model gpt2 --batch-size 16 --seq-len 1024" ;;
    llama) shape="--model llama3-1b --batch-size 4 --seq-len 2048" ;;
    *) echo "PROFILES: unknown model $model (gpt2, llama)"; continue ;;
  esac
  # shellcheck disable=SC2086
  build-gpu/carry/flashtrain train --device cuda --val-data '' --sample-tokens 0 --steps 4 \
    --warmup 2 --lr 1e-4 $shape --dtype bf16 --attention flash --profile 3 2>&1 |
    tail -45 >"$OUT/profile_$model.txt"
  echo "== profile $model"
  grep -h "^norm\|^rope\|^classifier\|^optimizer\|^step  " "$OUT/profile_$model.txt"
done
if [ "${CENSUS:-0}" = 1 ]; then scripts/gpu_census.sh | head -25; fi
tar -czf "$real_out/step.tgz" -C "$OUT" .
echo "packed: $real_out/step.tgz"
