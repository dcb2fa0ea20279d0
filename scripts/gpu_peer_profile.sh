#!/usr/bin/env bash
# Runs on the GPU machine: Nsight Compute on the peer's attention forward or backward (PyTorch SDPA
# with one backend, cuDNN by default) at a bench case, so that its kernels' figures (duration,
# clocks, tensor pipe, issue slots, registers, threads, shared memory, instruction mix) sit beside
# ours from scripts/gpu_profile.sh. The pass runs inside an NVTX range ("fwd" or "bwd") and only
# kernels in that range are profiled. Logs and reports under $OUT/peer_profile (default ./gpu-out).
#
#   scripts/gpu_peer_profile.sh                                  # cuDNN, hero causal at B=4
#   BACKEND=FLASH_ATTENTION CASE="8 1024 12 12 64" scripts/gpu_peer_profile.sh
#   PASS=backward CASE="8 1024 12 12 64" scripts/gpu_peer_profile.sh   # cuDNN's backward kernels
#
# CASE: "batch seq_len q_heads kv_heads head_dim" (causal); BACKEND: an SDPBackend name;
# PASS: forward (default) or backward;
# SECTIONS: ncu's sections (default: --set full with source counters).
set -uo pipefail
out="${OUT:-gpu-out}/peer_profile"
mkdir -p "$out"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}" PATH="/usr/local/cuda/bin:$PATH"
command -v ncu >/dev/null || { echo "ncu not found (Nsight Compute)"; exit 2; }
read -r B S HQ HKV D <<<"${CASE:-4 4096 16 4 128}"
pass="${PASS:-forward}"
case "$pass" in
  forward) range=fwd grad=False ;;
  backward) range=bwd grad=True ;;
  *) echo "PASS must be forward or backward, not '$pass'"; exit 2 ;;
esac
name="${BACKEND:-CUDNN_ATTENTION}_${range}_b${B}_s${S}_h${HQ}g${HKV}_d${D}"
cat >"$out/peer_$range.py" <<PY
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
torch.manual_seed(0)
def make(heads):
    return torch.randn($B, heads, $S, $D, device="cuda", dtype=torch.bfloat16,
                       requires_grad=$grad)
q, k, v = make($HQ), make($HKV), make($HKV)
def forward():
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=$HQ != $HKV)
with sdpa_kernel(SDPBackend.${BACKEND:-CUDNN_ATTENTION}), torch.set_grad_enabled($grad):
    for _ in range(3):  # plans and autotuning outside the profiled range
        o = forward()
        if $grad:
            o.backward(torch.ones_like(o))
    torch.cuda.synchronize()
    if $grad:
        o = forward()
        do = torch.randn_like(o)
        torch.cuda.synchronize()
    if $grad:
        # The backward runs on autograd's device thread, and NVTX ranges belong to a thread:
        # the range opens when o's gradient arrives there and closes when q's is made.
        def open_range(grad):
            torch.cuda.nvtx.range_push("$range")  # a hook that returns None keeps the gradient
        def close_range(grad):
            torch.cuda.nvtx.range_pop()
        o.register_hook(open_range)
        q.register_hook(close_range)
        o.backward(do)
    else:
        torch.cuda.nvtx.range_push("$range")
        forward()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
print("ok")
PY
# shellcheck disable=SC2086
ncu --clock-control none ${SECTIONS:---set full --import-source yes} --nvtx --nvtx-include "$range/" \
  -c 4 -f -o "$out/$name" python3 "$out/peer_$range.py" >"$out/${name}_run.log" 2>&1 ||
  { echo "ncu failed:"; tail -20 "$out/${name}_run.log"; exit 1; }
ncu -i "$out/$name.ncu-rep" --page details --print-details all >"$out/${name}_details.txt" 2>&1
ncu -i "$out/$name.ncu-rep" --page source --csv --print-source sass >"$out/${name}_sass.csv" 2>&1
echo "== peer $name"
grep -E "^  [a-zA-Z_0-9<>:, ]+\(|Duration|SM Frequency|Pipe Tensor Cycles Active  |Executed Instructions  |Issued Warp Per Scheduler|Registers Per Thread|Block Size|Grid Size|Dynamic Shared Memory Per Block" \
  "$out/${name}_details.txt" | head -40
