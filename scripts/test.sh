#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite: formatting, then every ctest test.
# GPU tests skip themselves when no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
scripts/check_format.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build
cd build
OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" ctest --output-on-failure --timeout 900 -j 2
