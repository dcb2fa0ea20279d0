#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, over binaries built by scripts/build_gpu.sh
# and carried as build-gpu/carry.tar.xz: the CUDA attention tests (flash over every compiled
# kernel configuration, naive, kernel configurations), compute-sanitizer memcheck, racecheck and
# synccheck on small cases that launch every compiled kernel, then the attention benchmark beside
# PyTorch (bench/attention_gpu.sh). Logs under $OUT (default ./gpu-out). Steps: $STEPS (default
# "tests sanitizer bench"; "smoke" runs a few small cases of every configuration first, under a
# short timeout, so that a hanging kernel costs a minute, not the call); GTEST_FILTER narrows
# the tests; every step runs under a timeout ($STEP_TIMEOUT seconds, default 540).
set -uo pipefail
out="${OUT:-gpu-out}"
mkdir -p "$out"
source scripts/gpu_env.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
tests=build-gpu/carry/test_attention
status=0

summary() {  # name, exit code, log
  printf '%-28s exit %d  %s\n' "$1" "$2" \
    "$(grep -E '^\[  (PASSED|FAILED|SKIPPED) |ERROR SUMMARY' "$3" | tr '\n' ' ' | cut -c1-160)"
  grep -E '^\[  FAILED  \]' "$3" | head -20
  [ "$2" -eq 0 ] || status=1
}

limit="${STEP_TIMEOUT:-540}"
# Small cases; the bf16 test launches every compiled configuration, fp32 its kernels. The
# 1000-position case with documents is there for the tma forward's producer, which stages the
# next work tile's table and Q in the middle of a tile longer than its ring; the 384-position
# cases give some of the tma forward's persistent blocks a second work tile to claim.
small='*CudaFlashAccuracy.*/s7_h8g2_d32_window3_segments:*CudaFlashAccuracy.*/s64_h8g8_d128_causal_window8_scattered:*CudaFlashAccuracy.*/s64_h2g1_d64_scattered_segments:*CudaFlashAccuracy.*/s64_h1_d256_causal_window1:*CudaFlashAccuracy.Bf16WithinTwiceNaiveForEveryConfig/s1000_h8g4_d128_segments:*CudaFlashAccuracy.Bf16WithinTwiceNaiveForEveryConfig/s384_h16g4_d*_causal_segments'
for step in ${STEPS:-tests sanitizer bench}; do
  start=$(date +%s)
  case "$step" in
    smoke)
      timeout 120 "$tests" --gtest_color=no --gtest_filter="$small" >"$out/smoke.log" 2>&1
      summary smoke $? "$out/smoke.log"
      ;;
    tests)
      timeout "$limit" "$tests" --gtest_color=no \
        --gtest_filter="${GTEST_FILTER:-*CudaFlash*:*CudaNaive*:KernelConfig*}" >"$out/tests.log" 2>&1
      summary tests $? "$out/tests.log"
      ;;
    sanitizer)
      for tool in memcheck racecheck synccheck; do
        timeout "$limit" compute-sanitizer --tool "$tool" --error-exitcode 9 "$tests" \
          --gtest_color=no --gtest_filter="$small" >"$out/sanitizer_$tool.log" 2>&1
        rc=$?
        # racecheck also reports hazards inside cuBLAS's sm90 GEMMs (nvjet_*, which the naive
        # reference runs at 1000 positions); only hazards in other kernels fail the step.
        if [ "$tool" = racecheck ] && [ "$rc" -eq 9 ] &&
          grep -q '^\[  PASSED  \]' "$out/sanitizer_$tool.log" &&
          ! grep -A1 'Race reported' "$out/sanitizer_$tool.log" | grep -o 'access at [A-Za-z0-9_]*' |
          grep -vq 'access at nvjet_'; then
          echo "racecheck: $(grep -c 'Race reported' "$out/sanitizer_$tool.log") hazards, all in cuBLAS's nvjet kernels"
          rc=0
        fi
        summary "sanitizer $tool" "$rc" "$out/sanitizer_$tool.log"
      done
      ;;
    bench)
      OUT="$out/bench" BENCH_BIN=build-gpu/carry/bench_attention_gpu timeout "$limit" \
        bench/attention_gpu.sh ${BENCH_ARGS:-} >"$out/bench.log" 2>&1
      rc=$?
      cat "$out/bench.log"
      [ $rc -eq 0 ] || status=1
      ;;
    *) echo "unknown step '$step' (steps: smoke tests sanitizer bench)"; status=1 ;;
  esac
  echo "-- $step: $(($(date +%s) - start)) s"
done
exit $status
