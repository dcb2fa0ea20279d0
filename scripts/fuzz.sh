#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (clang, AddressSanitizer + UndefinedBehaviorSanitizer,
# CPU only) in build-fuzz/ and runs each for FUZZ_SECONDS (default 20) from its seed corpus
# tests/fuzz/corpus/<name>/ (every committed input runs first: the regression cases). New inputs
# go to build-fuzz/corpus/, never into the committed seeds.
# A finding fails the run: a crash, a sanitizer report, a leak, an exception other than ft::Error,
# one allocation over FUZZ_MALLOC_MB (default 64; the seeds need under 1) or an input slower than
# 10 s. The input that found it is written to build-fuzz/findings/<target>/; once the reader is
# fixed, commit it to the target's corpus as a regression case.
# Usage: scripts/fuzz.sh [fuzz_TARGET ...]   (default: every target)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${FUZZ_SECONDS:-20}"
malloc_mb="${FUZZ_MALLOC_MB:-64}"

# -O1: the usual fuzzing trade of run speed for build time (CI builds this on 2 cores).
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" -DCMAKE_CXX_COMPILER=clang++ -DFLASHTRAIN_CUDA=OFF \
  -DFLASHTRAIN_FUZZ=ON >/dev/null
ninja -C build-fuzz fuzz_targets

targets=("$@")
if ((${#targets[@]} == 0)); then
  for src in tests/fuzz/fuzz_*.cpp; do targets+=("$(basename "$src" .cpp)"); done
fi

# One target per core at a time (FUZZ_JOBS, default the core count): each fuzzer is one
# process on one thread, so two cores run two targets in the time of one.
jobs="${FUZZ_JOBS:-$(nproc)}"

# Runs target $1 and writes its one-line verdict to build-fuzz/$1.verdict; status 1 on a finding.
run_target() {
  local t=$1
  local seeds="tests/fuzz/corpus/${t#fuzz_}"
  local work="build-fuzz/corpus/$t"
  local findings="build-fuzz/findings/$t"
  local log="build-fuzz/$t.log"
  local verdict="build-fuzz/$t.verdict"
  rm -rf "$work"
  mkdir -p "$work" "$findings"
  local start=$SECONDS
  if OMP_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "build-fuzz/$t" -max_total_time="$seconds" -malloc_limit_mb="$malloc_mb" -timeout=10 \
    -artifact_prefix="$findings/" -print_final_stats=1 "$work" "$seeds" >"$log" 2>&1; then
    local runs cov
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    echo "fuzz: $t ok: ${runs:-?} inputs in $((SECONDS - start)) s, $cov, $(ls "$seeds" | wc -l) seeds" \
      >"$verdict"
  else
    {
      echo "fuzz: $t FAILED (log $log, input in $findings/):"
      grep -E "ERROR|SUMMARY|terminate|what\(\)|out-of-memory|Test unit written" "$log" | head -20
    } >"$verdict"
    return 1
  fi
}

for t in "${targets[@]}"; do
  [ -d "tests/fuzz/corpus/${t#fuzz_}" ] || { echo "fuzz: $t has no seed corpus tests/fuzz/corpus/${t#fuzz_}"; exit 1; }
done
failed=0
running=0
for t in "${targets[@]}"; do
  if ((running >= jobs)); then
    wait -n || failed=1
    running=$((running - 1))
  fi
  run_target "$t" &
  running=$((running + 1))
done
while ((running > 0)); do
  wait -n || failed=1
  running=$((running - 1))
done
for t in "${targets[@]}"; do cat "build-fuzz/$t.verdict"; done
exit "$failed"
