#!/usr/bin/env bash
# Installs what flashtrain needs to build and test, from Debian's packages and PyPI.
# Idempotent: installs only what is missing, so it is cheap to call before every build.
set -euo pipefail

debian_packages=(
  build-essential cmake ninja-build   # compiler and build
  libopenblas-openmp-dev              # CPU GEMMs (OpenMP threading, like our own kernels)
  libcli11-dev                        # command-line flags
  nlohmann-json3-dev                  # JSON logs and configs
  libgtest-dev                        # tests
  # Data parallelism: mpirun launches the ranks (and the 2-rank CPU tests); mpi.h builds
  # src/dist, which opens libmpi at run time only (one process needs no MPI).
  openmpi-bin libopenmpi-dev
  clang-format                        # formatting check
  clang libclang-rt-dev libomp-dev    # fuzzing (scripts/fuzz.sh): libFuzzer and sanitizers
  python3 python3-pip python3-venv    # data preparation script, the Python package's tests
)

missing=()
for p in "${debian_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "bootstrap: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

# The BPE encoder in scripts/prepare_data.py needs the `regex` module (Unicode classes).
if ! python3 -c "import regex" 2>/dev/null; then
  echo "bootstrap: installing the Python package regex"
  python3 -m pip install -q regex 2>/dev/null ||
    python3 -m pip install -q --break-system-packages regex
fi

# The Python package (pyproject.toml): its build tools and what its tests import. PyTorch and
# transformers are not among them: the tests that need them skip themselves.
python_packages=(scikit-build-core nanobind numpy pytest safetensors ml_dtypes)
missing_py=()
for p in "${python_packages[@]}"; do
  python3 -c "import ${p//-/_}" 2>/dev/null || missing_py+=("$p")
done
if ((${#missing_py[@]})); then
  echo "bootstrap: installing the Python packages ${missing_py[*]}"
  python3 -m pip install -q "${missing_py[@]}" 2>/dev/null ||
    python3 -m pip install -q --break-system-packages "${missing_py[@]}"
fi
