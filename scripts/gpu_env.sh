# Sourced (not run) by the scripts that run on the GPU machine from the repository root
# (gpu_check.sh, gpu_attention.sh, gpu_profile.sh, gpu_study.sh, bench/gpu_train.sh): the CUDA
# tools and libraries on the paths, /work/main pointing at this checkout (the binaries find
# data/ and the sources through the path compiled into them), and the binaries of
# scripts/build_gpu.sh unpacked from build-gpu/carry.tar.xz into build-gpu/carry, with
# build-gpu/flashtrain (the path the CLI tests run) linked to the carried CLI. Returns non-zero
# when there is nothing to unpack (unless CARRY_OPTIONAL is set, below).
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PATH="/usr/local/cuda/bin:$PATH"
if [ ! -e /work/main/data ]; then mkdir -p /work && ln -sfn "$PWD" /work/main; fi
# CARRY_OPTIONAL=1 (scripts/gpu_variants.sh, whose binaries come in build-gpu/variants.tar.xz):
# no carry is not an error.
if [ ! -d build-gpu/carry ]; then
  if [ -f build-gpu/carry.tar.xz ] || [ -z "${CARRY_OPTIONAL:-}" ]; then
    tar -C build-gpu -xJf build-gpu/carry.tar.xz || return 1
  fi
fi
if [ -d build-gpu/carry ]; then ln -sfn carry/flashtrain build-gpu/flashtrain; fi
# Binaries built in another checkout than /work/main (a worktree) carry its path, compiled into
# the tests (scripts/build_gpu.sh): link it here too.
if [ -f build-gpu/carry/SOURCE_DIR ]; then
  built_in="$(cat build-gpu/carry/SOURCE_DIR)"
  if [ -n "$built_in" ] && [ ! -e "$built_in" ]; then
    mkdir -p "$(dirname "$built_in")" && ln -sfn "$PWD" "$built_in"
  fi
fi
