#!/usr/bin/env bash
# GPU training throughput, flashtrain beside the PyTorch eager peer in the same call:
# GPT-2 124M batch 8 x 1024 in bf16 and fp32, and the llama3-1b shape batch 4 x 2048 in bf16,
# with naive attention on both sides, then flash attention against PyTorch's SDPA (eager, and
# torch.compile'd for GPT-2 at batch 16).
# RUNS selects rows (default: all). Runs on the GPU machine over build-gpu/carry.
# Output: one line per run, flashtrain's summary and the peer's JSON; logs under $OUT.
set -uo pipefail
out="${OUT:-gpu-out}"
mkdir -p "$out"
source scripts/gpu_env.sh || exit 1
cli=build-gpu/carry/flashtrain
steps="${STEPS:-20}"
run() {  # name, flashtrain flags, peer flags (none: ours alone), steps (default $STEPS)
  local name=$1 ours=$2 peer=${3:-} steps=${4:-$steps}
  case " ${RUNS:-$name} " in *" $name "*) ;; *) return ;; esac
  $cli train --device cuda --val-data '' --sample-tokens 0 --steps "$steps" \
    --warmup 5 --lr 1e-4 $ours >"$out/ft_$name.log" 2>&1
  echo "flashtrain $name: $(grep '^steps ' "$out/ft_$name.log" || tail -2 "$out/ft_$name.log")"
  grep '^step ' "$out/ft_$name.log" | tail -1
  grep '^memory:' "$out/ft_$name.log"
  [ -n "$peer" ] || return 0
  python3 bench/torch_peer.py --steps "$steps" $peer 2>"$out/torch_$name.err" | tee "$out/torch_$name.json"
}
python3 bench/gpu_ceilings.py | tee "$out/ceilings.json"
run gpt2_bf16 "--model gpt2 --batch-size 8 --seq-len 1024 --dtype bf16 --attention naive" \
  "--model gpt2 --batch-size 8 --seq-len 1024 --dtype bf16 --attention naive"
run gpt2_fp32 "--model gpt2 --batch-size 8 --seq-len 1024 --dtype fp32 --attention naive" \
  "--model gpt2 --batch-size 8 --seq-len 1024 --dtype fp32 --attention naive"
run llama1b_bf16 "--model llama3-1b --batch-size 4 --seq-len 2048 --dtype bf16 --attention naive" \
  "--model llama3-1b --batch-size 4 --seq-len 2048 --dtype bf16 --attention naive"
run gpt2_bf16_flash "--model gpt2 --batch-size 8 --seq-len 1024 --dtype bf16 --attention flash" \
  "--model gpt2 --batch-size 8 --seq-len 1024 --dtype bf16 --attention sdpa"
run gpt2_fp32_flash "--model gpt2 --batch-size 8 --seq-len 1024 --dtype fp32 --attention flash" \
  "--model gpt2 --batch-size 8 --seq-len 1024 --dtype fp32 --attention sdpa"
# The torch.compile reference of the end-to-end bar: GPT-2 bf16 at batch 16, ours with flash
# against PyTorch's SDPA eager and compiled (the first warm-up step compiles).
run gpt2_bf16_b16_flash "--model gpt2 --batch-size 16 --seq-len 1024 --dtype bf16 --attention flash" \
  "--model gpt2 --batch-size 16 --seq-len 1024 --dtype bf16 --attention sdpa"
run gpt2_bf16_b16_compile "--model gpt2 --batch-size 16 --seq-len 1024 --dtype bf16 --attention flash" \
  "--model gpt2 --batch-size 16 --seq-len 1024 --dtype bf16 --attention sdpa --compile"
run llama1b_bf16_flash \
  "--model llama3-1b --batch-size 4 --seq-len 2048 --dtype bf16 --attention flash" \
  "--model llama3-1b --batch-size 4 --seq-len 2048 --dtype bf16 --attention sdpa"
# torch.compile beside the llama3-1b shape too (the bar of the step-speed work).
run llama1b_bf16_compile \
  "--model llama3-1b --batch-size 4 --seq-len 2048 --dtype bf16 --attention flash" \
  "--model llama3-1b --batch-size 4 --seq-len 2048 --dtype bf16 --attention sdpa --compile"
# The norms' and SwiGLU's outputs recomputed in the backward (--recompute elementwise): the
# peak memory it saves against the row above and what it costs in tok/s, ours alone.
run llama1b_bf16_elementwise \
  "--model llama3-1b --batch-size 4 --seq-len 2048 --dtype bf16 --attention flash --recompute elementwise"
# Every step run as usual (--cuda-graph off): what replaying the captured step (the default on
# one GPU) saves, ours alone.
run gpt2_bf16_b16_eager \
  "--model gpt2 --batch-size 16 --seq-len 1024 --dtype bf16 --attention flash --cuda-graph off"
run llama1b_bf16_eager \
  "--model llama3-1b --batch-size 4 --seq-len 2048 --dtype bf16 --attention flash --cuda-graph off"
# GEMM algorithms chosen by timing (--gemm-tune), ours alone.
run gpt2_bf16_b16_tuned \
  "--model gpt2 --batch-size 16 --seq-len 1024 --dtype bf16 --attention flash --gemm-tune"
run llama1b_bf16_tuned \
  "--model llama3-1b --batch-size 4 --seq-len 2048 --dtype bf16 --attention flash --gemm-tune"
# q, k, v copied out of the fused projection (--split-qkv): what reading them in place saves,
# ours alone.
run gpt2_bf16_b16_flash_split \
  "--model gpt2 --batch-size 16 --seq-len 1024 --dtype bf16 --attention flash --split-qkv"
run llama1b_bf16_flash_split \
  "--model llama3-1b --batch-size 4 --seq-len 2048 --dtype bf16 --attention flash --split-qkv"
# Long context, batch 1: 32768 positions beside PyTorch eager and compiled (out of memory is a
# result, printed as such), then 65536 and 131072, ours alone, recomputing where it must.
# Fewer steps at the long rows (seconds per step).
run llama1b_32k "--model llama3-1b --batch-size 1 --seq-len 32768 --context 32768 --dtype bf16 --attention flash" \
  "--model llama3-1b --batch-size 1 --seq-len 32768 --dtype bf16 --attention sdpa" 10
run llama1b_32k_compile "--model llama3-1b --batch-size 1 --seq-len 32768 --context 32768 --dtype bf16 --attention flash" \
  "--model llama3-1b --batch-size 1 --seq-len 32768 --dtype bf16 --attention sdpa --compile" 10
run llama1b_64k "--model llama3-1b --batch-size 1 --seq-len 65536 --context 65536 --dtype bf16 --attention flash" "" 6
run llama1b_128k "--model llama3-1b --batch-size 1 --seq-len 131072 --context 131072 --dtype bf16 --attention flash --recompute block" "" 4
# The classifier over the whole micro-batch at once (--classifier-chunk 0): what the chunks
# (the default, auto) save in peak memory and cost in tok/s, ours alone.
run gpt2_bf16_b16_flash_whole \
  "--model gpt2 --batch-size 16 --seq-len 1024 --dtype bf16 --attention flash --classifier-chunk 0"
run llama1b_bf16_flash_whole \
  "--model llama3-1b --batch-size 4 --seq-len 2048 --dtype bf16 --attention flash --classifier-chunk 0"
# Classifier chunks of a given size beside auto's (512 MiB: 2048 rows at llama3-1b's
# 128256-column vocabulary, the chunk2048 row; the 1024-row chunks of the earlier 256 MiB budget
# ran the classifier GEMMs at ~653-690 TFLOP/s where larger ones run ~780): what more rows a
# chunk buy in tok/s and cost in peak memory, ours alone.
run llama1b_bf16_chunk2048 \
  "--model llama3-1b --batch-size 4 --seq-len 2048 --dtype bf16 --attention flash --classifier-chunk 2048"
run llama1b_bf16_chunk4096 \
  "--model llama3-1b --batch-size 4 --seq-len 2048 --dtype bf16 --attention flash --classifier-chunk 4096"
run llama1b_32k_chunk8192 "--model llama3-1b --batch-size 1 --seq-len 32768 --context 32768 --dtype bf16 --attention flash --classifier-chunk 8192" "" 10
