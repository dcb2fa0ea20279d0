#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite: formatting, every ctest test, the Python
# package built with pip and its pytest tests (scripts/test_python.sh), then every fuzz target for
# FUZZ_SECONDS (20) each (scripts/fuzz.sh). GPU tests skip themselves when no GPU is
# present. Prints the processor and the OpenBLAS core type first: CPU results depend on the kernel
# OpenBLAS picks (OPENBLAS_CORETYPE=Haswell|Zen|SkylakeX|Sandybridge|... forces one).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
scripts/check_format.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
build/flashtrain info
(cd build && ctest --output-on-failure --timeout 900 -j 2)
scripts/test_python.sh
scripts/fuzz.sh
