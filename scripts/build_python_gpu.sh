#!/usr/bin/env bash
# Builds, on this (GPU-less) machine, the Python package as a wheel for the GPU machine: CUDA on,
# sm_90a machine code only (CUDA_ARCHS=90a-real), OpenBLAS linked statically (the GPU machine has
# none), against Python 3.12's stable ABI (cp312-abi3: it loads into the GPU machine's Python 3.12
# and any later one). PYTHON: a Python 3.12 or newer here (default: python3.12 on the PATH, else
# pyenv's newest 3.12). Output: build-py/wheels/flashtrain-*.whl (name build-py/wheels in the
# device tool's carry list; scripts/gpu_python.sh installs and tests it there).
# FLASHTRAIN_TORCH (default ON) adds flashtrain._torch_ext, built against TORCH_PIP (default
# torch==2.11.0: PyPI's Linux wheel of it is the +cu130 build the GPU machine runs) installed in
# the build's virtual environment (pip's cache serves it again); the wheel is then
# cp312-cp312, and the extension loads only under that PyTorch (elsewhere the DLPack route
# serves). FLASHTRAIN_TORCH=OFF builds the stable-ABI wheel without it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
py="${PYTHON:-}"
if [ -z "$py" ]; then
  # The first that runs: a pyenv shim is on the PATH even where its version is not selected.
  pyenv_312=$(ls -d /root/.pyenv/versions/3.12*/bin/python3 2>/dev/null | sort -rV || true)
  for candidate in python3.12 $pyenv_312; do
    if "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
      py="$candidate"
      break
    fi
  done
fi
[ -n "$py" ] || { echo "build_python_gpu: no Python 3.12 found (set PYTHON)" >&2; exit 1; }
venv=build-py/venv-wheel
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
"$venv/bin/python" -c "import nanobind, scikit_build_core" 2>/dev/null ||
  "$venv/bin/python" -m pip install -q scikit-build-core nanobind
torch_ext="${FLASHTRAIN_TORCH:-ON}"
if [ "$torch_ext" != OFF ]; then
  "$venv/bin/python" -m pip install -q "${TORCH_PIP:-torch==2.11.0}"
  "$venv/bin/python" -c "import torch; print('build_python_gpu: against torch', torch.__version__)"
fi
rm -rf build-py/wheels
FLASHTRAIN_CUDA=ON FLASHTRAIN_STATIC_BLAS=ON CMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90a-real}" \
  FLASHTRAIN_TORCH="$torch_ext" \
  "$venv/bin/python" -m pip wheel -q --no-build-isolation --no-deps -w build-py/wheels .
ls -la build-py/wheels
