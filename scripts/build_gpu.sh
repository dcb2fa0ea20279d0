#!/usr/bin/env bash
# Builds, on this (GPU-less) machine, the binaries that scripts/gpu_check.sh (and
# scripts/gpu_attention.sh) run on the GPU machine: CUDA on, sm_90a machine code only (no PTX:
# CUDA_ARCHS=90a-real), OpenBLAS linked statically (the GPU machine has no OpenBLAS),
# test and CLI binaries stripped of host symbols and packed so that they travel light.
# Output: build-gpu/carry.tar.xz (name it in the device tool's carry list).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHTRAIN_CUDA=ON \
  -DFLASHTRAIN_STATIC_BLAS=ON -DFLASHTRAIN_SWEEP_KERNELS="${SWEEP_KERNELS:-OFF}" -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90a-real}" >/dev/null
# BINARIES narrows what is built and packed (each binary holds the whole library: about 6 MB
# packed); JOBS caps ninja's parallel jobs (default: ninja's own).
binaries="${BINARIES:-flashtrain test_core test_nn test_attention test_models test_dist test_train \
  test_apps test_sweep bench_attention_gpu}"
# The test binaries' CLI tests run the carried flashtrain (build-gpu/flashtrain): it goes along.
case " $binaries " in
  *" test_"*) case " $binaries " in *" flashtrain "*) ;; *) binaries="flashtrain $binaries" ;; esac ;;
esac
# An object whose recorded header dependencies are empty (ninja's log kept none: seen after an
# interrupted build) is rebuilt only when its own source changes, so a kernel header's change
# would silently not reach it (2026-12-06: the tma forward objects missed a day of changes).
# Remove such objects so that ninja compiles them again and records their headers.
ninja -C build-gpu -t deps | awk '/: #deps 0,/ { sub(/:$/, "", $1); print $1 }' |
  while read -r object; do rm -f "build-gpu/$object"; done
# shellcheck disable=SC2086  # the names are words
ninja -C build-gpu ${JOBS:+-j "$JOBS"} $binaries
rm -rf build-gpu/carry
mkdir -p build-gpu/carry
for b in $binaries; do
  strip -o "build-gpu/carry/$b" "build-gpu/$b"
done
# The commit the binaries come from (scripts/run_matrix.py records it): "<hash>" or "<hash> dirty".
{ git rev-parse HEAD; git diff --quiet HEAD -- || echo dirty; } | paste -sd' ' >build-gpu/carry/GIT_COMMIT
# The checkout the binaries were built in: the tests reach data/ and the CLI through this path,
# compiled into them, so scripts/gpu_env.sh links it to the GPU machine's checkout (a build in
# another worktree than /work/main otherwise fails its CLI tests there: exit 127).
pwd >build-gpu/carry/SOURCE_DIR
# The device tool carries at most 64 MiB: pack the binaries (about 165 MB raw). Each holds the
# whole library, so xz's largest dictionary (-9e: 64 MiB) finds one binary again in the next:
# about half the size of the default level's pack (12 against 23 MB for five binaries), for
# about a minute more (XZ_LEVEL=-6: the default level).
tar -C build-gpu -cf - carry | xz "${XZ_LEVEL:--9e}" -T2 >build-gpu/carry.tar.xz
ls -la build-gpu/carry.tar.xz
