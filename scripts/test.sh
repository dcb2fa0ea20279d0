#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite: formatting, ptxas's report of the CUDA kernels
# (scripts/check_ptxas.py), every ctest test, the Python package built with pip and its pytest
# tests (scripts/test_python.sh), then every fuzz target for
# FUZZ_SECONDS (20) each (scripts/fuzz.sh). GPU tests skip themselves when no GPU is
# present. Prints the processor and the OpenBLAS core type first: CPU results depend on the kernel
# OpenBLAS picks (OPENBLAS_CORETYPE=Haswell|Zen|SkylakeX|Sandybridge|... forces one).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
scripts/check_format.sh
# Without a GPU (CI) the CUDA sources compile for sm_90a alone: every kernel family is built for
# it (the Hopper ones only there, the mma.sync ones from the same source as for sm_80), which is
# the compile check a GPU-less machine can give, in about half the time of "80;90a".
# TEST_CUDA_ARCHS overrides it; with a GPU the build's default architectures are compiled.
archs=()
if ! nvidia-smi -L >/dev/null 2>&1; then
  archs=(-DCMAKE_CUDA_ARCHITECTURES="${TEST_CUDA_ARCHS:-90a-real}")
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${archs[@]}" >/dev/null
ninja -C build
# ptxas's report of the CUDA kernels (they cannot run here): no warpgroup products serialised,
# no waits injected, none in the tma kernels at all (exit 2: a build without CUDA, nothing to check).
rc=0
python3 scripts/check_ptxas.py build || rc=$?
[ "$rc" -eq 0 ] || [ "$rc" -eq 2 ]
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
build/flashtrain info
# One test per core, each on one thread (the tests take the caller's OMP_NUM_THREADS): two tests'
# OpenMP teams on two cores wait at every barrier for each other's preempted threads (ctest took
# 700 s on this machine with two threads a test, 132 s with one). tests/nn/test_threads.cpp and
# tests/attention/test_attention_threads.cpp set their own thread counts, so the threaded paths
# are still tested.
(cd build && OMP_NUM_THREADS=1 ctest --output-on-failure --timeout 900 -j "$(nproc)")
scripts/test_python.sh
scripts/fuzz.sh
