#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root: installs the wheel that
# scripts/build_python_gpu.sh built (carried as build-py/wheels) into /tmp/flashtrain-site and runs
# tests/python with the machine's PyTorch, transformers and GPU, so that the GPU tests run there
# instead of skipping. The converter and transformers tests also need the CLI, and the benchmark
# the C++ bench: carry build-gpu/carry.tar.xz from scripts/build_gpu.sh
# (BINARIES="flashtrain bench_attention_gpu"); flashtrain's side of the transformers tests then
# runs on the GPU (FLASHTRAIN_HF_DEVICE, default cuda). Then, unless BENCH=0,
# bench/python_attention.py: flashtrain from Python beside PyTorch SDPA's backends and the C++
# bench on the same shapes, and the binding's overhead per call (BENCH_ARGS: its flags, as shell
# words; TESTS=0 runs only the benchmark), and bench/python_routes.py: the DLPack route and the
# PyTorch extension back to back (ROUTES_ARGS: its flags; ROUTES=0 skips it). Where the wheel
# has the extension (flashtrain._torch_ext, the default route for PyTorch tensors), the PyTorch
# tests run a second time on the DLPack route (FLASHTRAIN_TORCH_EXT=0; DLPACK_TESTS=0 skips
# that). Extra arguments go to pytest (e.g. -k torch). Logs under $OUT (default ./gpu-out):
# gpu.txt, pytest.log, pytest-dlpack.log, python_attention.md (the tables), python_attention.jsonl,
# python_attention.log (progress), python_routes.md, python_routes.jsonl. Exits non-zero when
# pytest or a benchmark failed.
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
python3 -c "
import importlib, platform
found = []
for name in ('torch', 'transformers', 'cupy', 'jax', 'numpy'):
    try:
        found.append(name + ' ' + importlib.import_module(name).__version__)
    except Exception as e:
        found.append(name + ' missing (' + type(e).__name__ + ')')
print('python', platform.python_version() + ';', ', '.join(found))
try:
    import torch
    from flashtrain import attention
    route = type(attention._torch_handles()).__name__
    print('flashtrain route for PyTorch tensors:', route)
except Exception as e:
    print('flashtrain route for PyTorch tensors: unknown (' + type(e).__name__ + ': ' + str(e) + ')')
" | tee -a "$out/gpu.txt"
status=0
if [ "${TESTS:-1}" != 0 ]; then
  python3 -m pytest -q -p no:cacheprovider -rs --durations=10 tests/python "$@" 2>&1 |
    tee "$out/pytest.log"
  status=${PIPESTATUS[0]}
  if [ "${DLPACK_TESTS:-1}" != 0 ] && grep -q "route.*_TorchExtension" "$out/gpu.txt"; then
    FLASHTRAIN_TORCH_EXT=0 python3 -m pytest -q -p no:cacheprovider -rs tests/python/test_torch.py \
      tests/python/test_dlpack_gpu.py "$@" 2>&1 | tee "$out/pytest-dlpack.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  fi
fi
# bench NAME ARGS...: bench/NAME.py with ARGS, its tables to $out/NAME.md, its rows to
# NAME.jsonl, its progress to NAME.log; a failure sets status.
bench() {
  local name=$1
  shift
  python3 "bench/$name.py" --jsonl "$out/$name.jsonl" "$@" 2>"$out/$name.log" |
    tee "$out/$name.md"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    echo "$name: exit $rc; the last lines of $out/$name.log:"
    tail -5 "$out/$name.log"
    status=1
  fi
}
if [ "${BENCH:-1}" != 0 ]; then
  bench_args=()
  eval "bench_args=(${BENCH_ARGS:-})"
  bench python_attention "${bench_args[@]}"
  if [ "${ROUTES:-1}" != 0 ] && grep -q "route.*_TorchExtension" "$out/gpu.txt"; then
    routes_args=()
    eval "routes_args=(${ROUTES_ARGS:---device cuda --dtype bf16,fp32 --dir fwd,fwd+bwd})"
    bench python_routes "${routes_args[@]}"
  fi
fi
exit "$status"
