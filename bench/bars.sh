#!/usr/bin/env bash
# The open performance issues' bars, measured on this GPU part by part, then judged by
# bench/bars.py over every part measured so far under $OUT. The parts' cases and rows come from
# bench/bars.py (its PARTS: one list for both); each part is meant to fit one 10-minute device
# call, and several parts may go in one command.
#
#   bench/bars.sh attention          # issues 14 and 16: the bars' attention cases beside cuDNN and
#                                    # FlexAttention, the deterministic backward timed too
#   bench/bars.sh compile            # issue 17: GPT-2 16 x 1024 and llama3-1b 4 x 2048 against
#                                    # torch.compile
#   bench/bars.sh long               # issue 17: llama3-1b at 32768 positions beside PyTorch eager
#                                    # and torch.compile, then 65536 and 131072, ours alone
#   bench/bars.sh attention compile  # two parts, one after the other
#
# Runs on the GPU machine from the repository root, over the binaries of scripts/build_gpu.sh
# (flashtrain and bench_attention_gpu, carried as build-gpu/carry.tar.xz). Environment: OUT
# (default out/bars; part P writes to OUT/P, the verdicts to OUT/bars.md), PYTHON (default
# python3), and what bench/attention_gpu.sh and bench/gpu_train.sh read (BENCH_BIN, STEPS, ...).
# Exits non-zero when a part's bench failed; a bar not met is a verdict, not a failure.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
python="${PYTHON:-python3}"
parts="attention compile long"
usage() {  # the comment above; on stderr unless asked for
  if [ "$1" -eq 0 ]; then exec 3>&1; else exec 3>&2; fi
  sed -n '2,/^set /p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&3
  exit "$1"
}
[ $# -gt 0 ] || usage 2
for part in "$@"; do  # every name checked before any part runs
  case "$part" in
    -h | --help) usage 0 ;;
    attention | compile | long) ;;
    *)
      echo "bars.sh: unknown part '$part' (parts: $parts; --help)" >&2
      exit 2
      ;;
  esac
done
out="${OUT:-out/bars}"
mkdir -p "$out"
status=0
for part in "$@"; do
  start=$(date +%s)
  echo "== part $part"
  list="$("$python" bench/bars.py --part "$part")" || exit 1
  case "$part" in
    attention)
      OUT="$out/$part" OURS_ARGS='--deterministic' PEER_ARGS='--impl sdpa-cudnn,flex' \
        bench/attention_gpu.sh --case "$list" || status=1
      ;;
    *) OUT="$out/$part" RUNS="$list" bench/gpu_train.sh || status=1 ;;
  esac
  echo "== part $part: $(($(date +%s) - start)) s"
done
dirs=()
for part in $parts; do
  if [ -d "$out/$part" ]; then dirs+=("$out/$part"); fi
done
echo
"$python" bench/bars.py "${dirs[@]}" | tee "$out/bars.md"
exit $status
