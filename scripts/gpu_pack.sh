#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root: one step of a device call. COMMAND runs with
# OUT=$OUT/NAME (the GPU scripts write their logs under $OUT) under a time limit, its output into
# $OUT/NAME/output.log, of which the last lines are printed; then $OUT/NAME is appended to
# $OUT/results.tar and removed. The device tool brings back only a few files of $OUT, and what a
# call that runs past its limit leaves there: chained steps keep everything packed so far.
#
#   LIMIT=90 scripts/gpu_pack.sh d256 bench/attention_gpu.sh --case hero-d256
#   GPU_TESTS=test_nn scripts/gpu_pack.sh tests scripts/gpu_check.sh
#   scripts/gpu_pack.sh --gzip                  # at the end: results.tar -> results.tar.gz
#
# LIMIT: seconds (default 300); TAIL: lines of output printed (default 40). Exits with COMMAND's
# status (124 when the limit stopped it).
set -uo pipefail
root="${OUT:-gpu-out}"
mkdir -p "$root"
if [ "${1:-}" = --gzip ]; then
  [ -f "$root/results.tar" ] && gzip -f "$root/results.tar"
  exit 0
fi
name="${1:?usage: scripts/gpu_pack.sh NAME COMMAND... | --gzip}"
shift
[ $# -gt 0 ] || { echo "gpu_pack: no command for step $name" >&2; exit 2; }
case "$name" in */* | .* | results.tar*) echo "gpu_pack: bad step name '$name'" >&2; exit 2 ;; esac
mkdir -p "$root/$name"
start=$(date +%s)
OUT="$root/$name" timeout "${LIMIT:-300}" "$@" >"$root/$name/output.log" 2>&1
rc=$?
tail -n "${TAIL:-40}" "$root/$name/output.log"
echo "gpu_pack: step $name exit $rc after $(($(date +%s) - start)) s"
tar -C "$root" -rf "$root/results.tar" "$name" && rm -rf "${root:?}/$name"
exit $rc
