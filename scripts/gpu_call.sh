#!/usr/bin/env bash
# One device call's work as a list of named steps, run in order inside a time budget, on the GPU
# machine from the repository root over the binaries of scripts/build_gpu.sh (carried as
# build-gpu/carry.tar.xz):
#
#   LIMIT=560 scripts/gpu_call.sh claims attention-tests sanitizer check bars:attention
#   LIMIT=560 scripts/gpu_call.sh bars:compile study:gpt2
#
# Steps (and how long each took on an H100, 2026-12-08, for planning a call):
#   claims           test_attention's tma forward claims tests (4 s)
#   attention-tests  STEPS=tests scripts/gpu_attention.sh: flash, naive, kernel configs (162 s)
#   sanitizer        STEPS=sanitizer scripts/gpu_attention.sh: memcheck, racecheck and
#                    synccheck (170 s, 150 of it racecheck)
#   check            scripts/gpu_check.sh over every test binary but test_attention (330 s:
#                    test_apps 132, test_train 84, test_sweep 65)
#   bars:PART        bench/bars.sh PART (attention, compile or long)
#   study:PART       scripts/gpu_study.sh PART (gpt2 120 s, llama3-1b_bf16 145 s)
#
# LIMIT (seconds, default 575) is the call's length: each step runs under a timeout of the time
# left (and so does each binary or tool inside it), and a step is skipped when less than
# MIN_SECONDS (default 60) is left, so that what ran before it still comes back under $OUT
# (default ./gpu-out). Each step's output goes to $OUT/<step>.txt and its last lines
# (TAIL_LINES, default 25) to stdout. Exits non-zero when a step failed, ran out of time or was
# skipped.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
usage() {  # the comment above; on stderr unless asked for
  if [ "$1" -eq 0 ]; then exec 3>&1; else exec 3>&2; fi
  sed -n '2,/^set /p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&3
  exit "$1"
}
[ $# -gt 0 ] || usage 2
for step in "$@"; do  # every name checked before any step runs
  case "$step" in
    -h | --help) usage 0 ;;
    claims | attention-tests | sanitizer | check) ;;
    bars:attention | bars:compile | bars:long) ;;
    study:?*) ;;
    *)
      echo "gpu_call.sh: unknown step '$step' (--help)" >&2
      exit 2
      ;;
  esac
done
limit="${LIMIT:-575}"
least="${MIN_SECONDS:-60}"
out="${OUT:-gpu-out}"
mkdir -p "$out"
source scripts/gpu_env.sh || exit 1
begin=$(date +%s)
status=0
for step in "$@"; do
  left=$((limit - ($(date +%s) - begin)))
  if [ "$left" -lt "$least" ]; then
    echo "== $step: skipped, ${left} s left"
    status=1
    continue
  fi
  echo "== $step (${left} s left)"
  start=$(date +%s)
  log="$out/${step//:/_}.txt"
  case "$step" in
    claims)
      timeout "$left" build-gpu/carry/test_attention --gtest_color=no \
        --gtest_filter='*TmaForwardClaim*' >"$log" 2>&1
      ;;
    attention-tests)
      OUT="$out/attention" STEPS=tests STEP_TIMEOUT="$left" scripts/gpu_attention.sh >"$log" 2>&1
      ;;
    sanitizer)
      OUT="$out/attention" STEPS=sanitizer STEP_TIMEOUT="$left" timeout "$left" \
        scripts/gpu_attention.sh >"$log" 2>&1
      ;;
    check)
      OUT="$out/check" GPU_TESTS="test_core test_nn test_models test_train test_apps test_dist \
test_sweep" TEST_TIMEOUT="$left" timeout "$left" scripts/gpu_check.sh >"$log" 2>&1
      ;;
    bars:*)
      OUT="$out/bars" timeout "$left" bench/bars.sh "${step#bars:}" >"$log" 2>&1
      ;;
    study:*)
      OUT="$out" CASE_TIMEOUT="$left" timeout "$left" scripts/gpu_study.sh "${step#study:}" \
        >"$log" 2>&1
      ;;
  esac
  rc=$?
  [ "$rc" -eq 0 ] || status=1
  echo "== $step: exit $rc, $(($(date +%s) - start)) s"
  tail -n "${TAIL_LINES:-25}" "$log"
done
exit $status
