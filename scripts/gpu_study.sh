#!/usr/bin/env bash
# The baseline-vs-flash study (configs/gpu_study.json) on the GPU machine, from the repository
# root, over the binaries of scripts/build_gpu.sh carried as build-gpu/carry.tar.xz. A device
# call has a time limit, so the study runs in parts, one per call:
#   scripts/gpu_study.sh gpt2             # GPT-2 124M, fp32 and bf16, seq 1024-8192 (2.5 min)
#   scripts/gpu_study.sh llama3-1b_bf16   # the llama3-1b shape in bf16 (3 min)
#   scripts/gpu_study.sh llama3-1b_fp32   # the llama3-1b shape in fp32 (4.5 min)
#   scripts/gpu_study.sh all              # everything in one go (a machine without a limit)
#   scripts/gpu_study.sh control          # configs/gpu_study_control.json (1.5 min): naive
#                                         # against itself with two micro-batches, lr 1e-4 and 1e-5
# Each part goes to $OUT/gpu_study/<part> (default ./gpu-out): the matrix's logs, environment,
# compare-loss and summary of that part. docs/STUDY.md says how to merge the parts.
set -uo pipefail
part="${1:-}"
config=configs/gpu_study.json
case "$part" in
  gpt2 | llama3-1b_bf16 | llama3-1b_fp32) only=("baseline/${part}_*" "flash/${part}_*") ;;
  all) only=() ;;
  control) only=() config=configs/gpu_study_control.json ;;
  *)
    echo "usage: scripts/gpu_study.sh gpt2|llama3-1b_bf16|llama3-1b_fp32|all|control" >&2
    exit 2
    ;;
esac
out="${OUT:-gpu-out}/gpu_study/$part"
mkdir -p "$out"
source scripts/gpu_env.sh || exit 1
python3 scripts/run_matrix.py "$config" --cli build-gpu/carry/flashtrain \
  --logdir "$out" --timeout "${CASE_TIMEOUT:-300}" ${only[@]+--only "${only[@]}"} |
  tee "$out/run_matrix.txt"
exit "${PIPESTATUS[0]}"
