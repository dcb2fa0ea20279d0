#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, over binaries built by scripts/build_gpu.sh
# and carried as build-gpu/carry.tar.xz: Nsight Compute on one launch of a flash kernel inside
# bench_attention_gpu, a per-opcode count of the executed instructions and stall samples, and the
# stall samples at each wait (scripts/ncu_sass_summary.py; the figures docs/PERF.md quotes). Logs
# and reports under $OUT (default ./gpu-out/profile).
#
#   scripts/gpu_profile.sh                                  # wgmma forward and backward, hero causal, B=4
#   KERNELS=forward CASE=hero-window-docs CONFIG='fwd=64x64/128/wgmma bwd=64x64/128/wgmma' \
#     scripts/gpu_profile.sh
#   SECTIONS='--section SpeedOfLight --section WarpStateStats' scripts/gpu_profile.sh   # lighter
#
#   KERNELS=forward KERNEL_REGEX=tma_forward_kernel CONFIG='fwd=128x128/384/tma/s2/pp' \
#     scripts/gpu_profile.sh                              # the tma forward
#
#   KERNELS=classifier KERNEL_REGEX=cross_entropy_kernel TRAIN_ARGS='--model gpt2 \
#     --batch-size 16 --seq-len 1024' scripts/gpu_profile.sh   # a kernel of a training step
#
# KERNELS: forward and/or backward (matched as wgmma_<kernel>_kernel, or set KERNEL_REGEX);
# CASE, BATCH (default 4), CONFIG: passed to bench_attention_gpu (BENCH_ARGS: more of its flags,
# e.g. '--seq-len 2048 --q-heads 32'); SECTIONS: ncu's sections
# (default: --set full with source counters); NCU_ARGS (default --clock-control none: the
# clocks as the card runs them, not locked to base); BENCH: the bench binary (default the carried
# one; a variant's, build-gpu/variants/NAME/bench_attention_gpu, unpacked by gpu_variants.sh);
# TAG: a name for the report files (default the kernel). TRAIN_ARGS: profile the first launch
# matching KERNEL_REGEX in a two-step bf16 flash training run of that model and shape
# (`flashtrain train`) instead of the attention bench (LAUNCH_SKIP: matching launches to skip).
set -uo pipefail
out="${OUT:-gpu-out}/profile"
mkdir -p "$out"
source scripts/gpu_env.sh || exit 1
command -v ncu >/dev/null || { echo "ncu not found (Nsight Compute)"; exit 2; }
ncu --version | tail -1
status=0
if [ -n "${TRAIN_ARGS:-}" ]; then
  # shellcheck disable=SC2206
  program=(build-gpu/carry/flashtrain train --device cuda --val-data '' --sample-tokens 0
    --steps 2 --warmup 1 --lr 1e-4 --dtype bf16 --attention flash ${TRAIN_ARGS})
else
  program=("${BENCH:-build-gpu/carry/bench_attention_gpu}" --case "${CASE:-hero-causal}"
    --batch "${BATCH:-4}" --impl flash
    --config "${CONFIG:-fwd=128x128/256/wgmma bwd=64x128/256/wgmma}" --warmup 0 --iters 1)
  # shellcheck disable=SC2206
  program+=(${BENCH_ARGS:-})
fi
for k in ${KERNELS:-forward backward}; do
  regex="${KERNEL_REGEX:-wgmma_${k}_kernel}"
  tag="${TAG:-$k}"
  # shellcheck disable=SC2086
  ncu ${NCU_ARGS:---clock-control none} ${SECTIONS:---set full --import-source yes} \
    -k "regex:$regex" --launch-skip "${LAUNCH_SKIP:-0}" -c 1 -f -o "$out/$tag" \
    "${program[@]}" >"$out/${tag}_run.log" 2>&1 || { echo "ncu $tag failed"; status=1; continue; }
  ncu -i "$out/$tag.ncu-rep" --page details --print-details all >"$out/${tag}_details.txt" 2>&1
  ncu -i "$out/$tag.ncu-rep" --page source --csv --print-source sass >"$out/${tag}_sass.csv" 2>&1
  echo "== $tag ($regex)"
  grep -E "Duration|SM Frequency|Pipe Tensor Cycles Active  |Executed Instructions  |Issued Warp Per Scheduler|Registers Per Thread|Achieved Occupancy" \
    "$out/${tag}_details.txt" | awk '!seen[$1 $2 $3]++' | head -12
  # The opcode mix and, with stall samples, the waits by barrier (scripts/ncu_sass_summary.py).
  python3 scripts/ncu_sass_summary.py "$out/${tag}_sass.csv"
done
exit $status
