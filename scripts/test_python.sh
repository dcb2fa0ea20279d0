#!/usr/bin/env bash
# Builds the Python package with pip (scikit-build-core + nanobind, pyproject.toml) into a
# virtual environment, build-py/venv, and runs its tests (tests/python) with pytest. The build
# is the CPU one unless FLASHTRAIN_CUDA says otherwise: CI tests the NumPy path; tests that need
# PyTorch, transformers or a GPU skip themselves. The converter's end-to-end tests run the CLI
# (FLASHTRAIN_CLI, default build/flashtrain). Run by scripts/test.sh after ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build-py/venv/bin/python ] || python3 -m venv --system-site-packages build-py/venv
FLASHTRAIN_CUDA="${FLASHTRAIN_CUDA:-OFF}" build-py/venv/bin/python -m pip install -q \
  --no-build-isolation --no-deps .
# Outside the source tree, so that `import flashtrain` finds the installed package.
export FLASHTRAIN_CLI="${FLASHTRAIN_CLI:-$PWD/build/flashtrain}"
(cd build-py && venv/bin/python -m pytest -q -p no:cacheprovider ../tests/python "$@")
