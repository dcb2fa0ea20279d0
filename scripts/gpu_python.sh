#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root: installs the wheel that
# scripts/build_python_gpu.sh built (carried as build-py/wheels) into /tmp/flashtrain-site and runs
# tests/python with the machine's PyTorch, transformers and GPU, so that the GPU tests run there
# instead of skipping. The converter and transformers tests also need the CLI: carry
# build-gpu/carry.tar.xz from scripts/build_gpu.sh (BINARIES=flashtrain is enough); flashtrain's
# side of the transformers tests then runs on the GPU (FLASHTRAIN_HF_DEVICE, default cuda).
# Extra arguments go to pytest (e.g. -k torch). Log: $OUT/pytest.log (default ./gpu-out).
set -uo pipefail
out="${OUT:-gpu-out}"
mkdir -p "$out"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/flashtrain-site \
  build-py/wheels/flashtrain-*.whl || exit 1
export PYTHONPATH="/tmp/flashtrain-site${PYTHONPATH:+:$PYTHONPATH}"
if [ -f build-gpu/carry.tar.xz ]; then
  source scripts/gpu_env.sh
  export FLASHTRAIN_CLI="$PWD/build-gpu/carry/flashtrain"
fi
export FLASHTRAIN_HF_DEVICE="${FLASHTRAIN_HF_DEVICE:-cuda}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$out/gpu.txt"
python3 -m pytest -q -p no:cacheprovider -rs tests/python "$@" 2>&1 | tee "$out/pytest.log"
exit "${PIPESTATUS[0]}"
