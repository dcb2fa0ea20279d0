#!/usr/bin/env bash
# Attention on the GPU, flashtrain beside PyTorch in the same call: our CUDA flash kernels
# (bench_attention_gpu; naive too where it fits) and PyTorch's SDPA backends and FlexAttention
# (bench/torch_attention_peer.py) on the same cases (hero causal, hero window+documents, gpt2),
# forward and backward timed separately the same way. Prints one Markdown table per case, headed
# by the GPU, its driver and the torch version, each row's TFLOP/s beside the cuBLAS bf16 rate
# measured in the same call (bench/gpu_ceilings.py); keeps the raw JSON lines and logs.
#
#   bench/attention_gpu.sh                            # every case, default configs
#   bench/attention_gpu.sh --case gpt2 --iters 50     # flags common to both sides
#   OURS_ARGS='--config "fwd=128x64/128"' PEER_ARGS='--impl sdpa-flash,flex' bench/attention_gpu.sh
#
# Environment: OUT (where files go; default out/attention), BENCH_BIN (our binary; default
# build-gpu/carry/bench_attention_gpu, unpacked from build-gpu/carry.tar.xz when only that is
# there), PYTHON (default python3), OURS_ARGS / PEER_ARGS (flags for one side only, as shell
# words). Relative paths are taken from the repository root. Flags given to the script go to
# both sides: --case (comma list), --batch, --seq-len, --q-heads, --kv-heads, --head-dim,
# --window, --docs, --dtype, --dir, --warmup, --warmup-ms, --iters, --max-sets; --impl and
# --config differ per side.
# Exits non-zero when either side failed; the table still shows what was measured.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out="${OUT:-out/attention}"
mkdir -p "$out"
python="${PYTHON:-python3}"
bin="${BENCH_BIN:-build-gpu/carry/bench_attention_gpu}"
if [ -z "${BENCH_BIN:-}" ] && [ ! -x "$bin" ] && [ -f build-gpu/carry.tar.xz ]; then
  tar -C build-gpu -xJf build-gpu/carry.tar.xz || echo "could not unpack build-gpu/carry.tar.xz" >&2
fi
ours_args=() peer_args=()
eval "ours_args=(${OURS_ARGS:-})"
eval "peer_args=(${PEER_ARGS:-})"

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$out/gpu.txt" 2>/dev/null ||
  : >"$out/gpu.txt"
echo "GPU: $(head -1 "$out/gpu.txt" | grep . || echo "unknown (no nvidia-smi)")  (files under $out)"

status=0
ours="$out/attention_flashtrain.jsonl"
if [ -x "$bin" ]; then
  "$bin" "$@" "${ours_args[@]}" >"$ours" 2>"$out/attention_flashtrain.log"
  rc=$?
  echo "flashtrain ($bin): exit $rc, $(grep -c '"dir"' "$ours") rows"
  if [ $rc -ne 0 ]; then
    tail -5 "$out/attention_flashtrain.log"
    status=1
  fi
else
  echo "flashtrain: no executable at $bin (build bench_attention_gpu, or set BENCH_BIN)"
  : >"$ours"
  status=1
fi

peer="$out/attention_pytorch.jsonl"
"$python" bench/torch_attention_peer.py "$@" "${peer_args[@]}" >"$peer" \
  2>"$out/attention_pytorch.log"
rc=$?
echo "pytorch: exit $rc, $(grep -c '"dir"' "$peer") rows"
if [ $rc -ne 0 ]; then
  tail -5 "$out/attention_pytorch.log"
  status=1
fi

# The cuBLAS bf16 rate in the same call, the yardstick of every row's TFLOP/s.
"$python" bench/gpu_ceilings.py >"$out/ceilings.json" 2>"$out/ceilings.log" ||
  echo "gpu_ceilings: exit $? (no cuBLAS column)"
echo
"$python" bench/attention_table.py --gpu-info "$out/gpu.txt" --ceilings "$out/ceilings.json" \
  "$ours" "$peer" | tee "$out/attention_table.md"
exit $status
