#!/usr/bin/env bash
# Configures and builds flashtrain into build/ (CUDA when nvcc is found, else CPU only).
# Extra arguments go to cmake, e.g. scripts/build.sh -DFLASHTRAIN_CUDA=OFF
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
ninja -C build
