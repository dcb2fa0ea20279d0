#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, over binaries built by
# scripts/build_gpu.sh and carried as build-gpu/carry.tar.xz: the GPU description, then every
# test binary (GPU tests run there instead of skipping), logs under $OUT (default ./gpu-out).
# TEST_TIMEOUT (seconds, default none) bounds each binary; one that runs past it is stopped and
# the test it was in is named (a kernel that hangs shows as a timeout, not as a failure).
set -uo pipefail
out="${OUT:-gpu-out}"
mkdir -p "$out"
source scripts/gpu_env.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$out/gpu.txt"
nvcc --version | tail -1 | tee -a "$out/gpu.txt"
status=0
for t in ${GPU_TESTS:-test_core test_nn test_attention test_models test_dist test_train test_apps test_sweep}; do
  start=$(date +%s)
  timeout "${TEST_TIMEOUT:-0}" build-gpu/carry/$t --gtest_color=no \
    ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} >"$out/$t.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=1
  printf '%-16s exit %d  %4ds  %s\n' "$t" $rc $(($(date +%s) - start)) \
    "$(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$t.log" | tr '\n' ' ' | cut -c1-150)"
  grep -E '^\[  FAILED  \]' "$out/$t.log" | head -20
  if [ $rc -eq 124 ]; then
    echo "  stopped after ${TEST_TIMEOUT} s in $(grep -E '^\[ RUN      \]' "$out/$t.log" | tail -1 |
      sed 's/^\[ RUN      \] //')"
  fi
done
exit $status
