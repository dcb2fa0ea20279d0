#!/usr/bin/env bash
# Data parallelism on the GPU machine, from the repository root, over the binaries of
# scripts/build_gpu.sh (build-gpu/carry.tar.xz in the device tool's carry list). Logs, the
# environment and a summary go to $OUT/dist (default gpu-out/dist).
#
# Always (one GPU is enough):
#   - test_dist and the DataParallel tests of test_train on the GPU (NCCL at world size 1);
#   - GPT-2 124M bf16 16 x 1024, 30 steps, three ways: one process, `--dist nccl` (the NCCL
#     communicator and the buckets at world size 1, no mpirun) and `mpirun -np 1` (the same
#     with MPI): losses of fp32 (10 steps) and of bf16 (fp32 on the wire, what a world of one
#     sends) must be those of one process, bit for bit; bf16 on the wire within 1e-2.
# With two GPUs or more (issue 19): GPT-2 124M on 2 GPUs against 1 GPU with the same total batch
# (bf16 30 steps: scaling and losses within 1e-2; fp32 10 steps: within 1e-5), with and
# without --zero 1 (peak memory per GPU); llama3-1b bf16 4 x 2048 per GPU, with and without
# ZeRO-1; the sweep on every GPU against one; a rank killed mid-step.
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0) in every launch: exported, and passed to
# every rank by mpirun -x. PARTS picks parts, so that each call stays under a time limit
# (default "tests one overhead two sweep fault"; two, sweep and fault need two GPUs; overhead:
# alternating runs of one process and --dist nccl at world size 1, the buckets' cost per step).
set -uo pipefail
out="${OUT:-gpu-out}/dist"
mkdir -p "$out"
source scripts/gpu_env.sh || exit 1
export NCCL_NVLS_ENABLE=0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ft=build-gpu/carry/flashtrain
gpus=$(nvidia-smi -L | wc -l)
steps="${STEPS:-30}"
# vader single copy off: containers often forbid the cross-process reads it uses.
mpi="mpirun --bind-to none --mca btl_vader_single_copy_mechanism none -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -x PATH"
summary="$out/summary.txt"
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }
part() { case " ${PARTS:-tests one overhead two sweep fault} " in *" $1 "*) return 0 ;; esac; return 1; }

{
  date -u
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
  nvidia-smi topo -m
  mpirun --version | head -1
  ldconfig -p | grep -E 'libnccl|libmpi\.so' || true
  cat build-gpu/carry/GIT_COMMIT
} >"$out/environment.txt" 2>&1
say "gpus: $gpus ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"

# ---- tests ----
part tests && for t in "test_dist" "test_train --gtest_filter=*DataParallel*"; do
  name=${t%% *}
  build-gpu/carry/$t --gtest_color=no >"$out/$name.log" 2>&1
  say "$t: exit $? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$name.log" | tr '\n' ' ')"
done

# ---- a run; prints "ms/step tok/s" from its summary line ----
common="train --device cuda --val-data '' --sample-tokens 0 --warmup 5 --lr 1e-4"
train_run() {  # name, launcher (or ""), flags
  local name=$1 launcher=$2 flags=$3
  eval "$launcher $ft $common $flags --log $out/$name.jsonl" >"$out/$name.log" 2>&1
  local rc=$?
  local s
  s=$(grep '^steps ' "$out/$name.log" | sed -E 's/.*\| ([0-9]+) tok\/s \| ([0-9.]+) ms\/step.*/\2 ms\/step \1 tok\/s/')
  say "$(printf '%-28s exit %d  %s' "$name" $rc "${s:-$(tail -1 "$out/$name.log")}")"
}
compare() {  # base, test, threshold flags
  $ft compare-loss "$out/$1.jsonl" "$out/$2.jsonl" $3 >"$out/compare_$1_vs_$2.txt" 2>&1
  say "  compare-loss $1 vs $2 ($3): exit $? $(grep -m1 -iE '\| (pass|fail)' "$out/compare_$1_vs_$2.txt")"
}
peaks() {  # a log: the last step's peak used MB per rank
  python3 - "$out/$1.jsonl" <<'PY'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"train_loss"' in l]
last = steps[-1]
ranks = last.get("ranks") or [last]
print("peak used MB per GPU:", " ".join(f"{r['peak_used_mb']:.0f}" for r in ranks))
PY
}

gpt2="--model gpt2 --attention flash --batch-size 16 --seq-len 1024"
# ---- world size 1: the buckets' overhead, and exact losses ----
if part one; then
  # --deterministic: the bf16 attention backward adds its dQ parts in a fixed order (by default
  # two runs of one process differ from step 2 on), so that any difference is the
  # data-parallel path's.
  bf16="$gpt2 --dtype bf16 --steps $steps --deterministic"
  train_run gpt2_bf16_one "" "$bf16"
  train_run gpt2_bf16_nccl1 "" "$bf16 --dist nccl"
  train_run gpt2_bf16_mpirun1 "$mpi -np 1" "$bf16"
  train_run gpt2_bf16_nccl1_bf16wire "" "$bf16 --dist nccl --comm-dtype bf16"
  # A world of one sends fp32 (--comm-dtype auto): the losses are one process's, bit for bit;
  # bf16 on the wire rounds the gradients.
  compare gpt2_bf16_one gpt2_bf16_nccl1 "--threshold-bf16 0"
  compare gpt2_bf16_one gpt2_bf16_mpirun1 "--threshold-bf16 0"
  compare gpt2_bf16_one gpt2_bf16_nccl1_bf16wire "--threshold-bf16 1e-2"
  train_run gpt2_fp32_one "" "$gpt2 --dtype fp32 --steps 10"
  train_run gpt2_fp32_nccl1 "" "$gpt2 --dtype fp32 --steps 10 --dist nccl --zero 0"
  train_run gpt2_fp32_nccl1_zero "" "$gpt2 --dtype fp32 --steps 10 --dist nccl --zero 1"
  compare gpt2_fp32_one gpt2_fp32_nccl1 "--threshold-fp32 0"
  compare gpt2_fp32_one gpt2_fp32_nccl1_zero "--threshold-fp32 1e-5"
fi

# ---- world size 1: the buckets' overhead, measured in alternating runs ----
# One process, --dist nccl (the NCCL communicator, buckets, all-reduce of every bucket on the
# communication stream; fp32 on the wire) and the same with bf16 on the wire (two conversions of
# the gradients per step) in turn, ROUNDS (3) times each: the median step time of steps
# 6..30 of each run, the overhead from the medians of the runs. Run-to-run spread is printed
# beside it, so that an overhead under the noise reads as such.
if part overhead; then
  for round in $(seq "${ROUNDS:-3}"); do
    train_run "ovh_one_$round" "" "$gpt2 --dtype bf16 --steps 30"
    train_run "ovh_nccl1_$round" "" "$gpt2 --dtype bf16 --steps 30 --dist nccl"
    train_run "ovh_bf16wire_$round" "" "$gpt2 --dtype bf16 --steps 30 --dist nccl --comm-dtype bf16"
  done
  python3 - "$out" "${ROUNDS:-3}" <<'PY' | tee -a "$summary"
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def step_median(name):
    ms = [json.loads(l)["ms"] for l in open(f"{out}/{name}.jsonl") if '"train_loss"' in l]
    return statistics.median(ms[5:])
def runs(kind):
    return [step_median(f"ovh_{kind}_{r}") for r in range(1, rounds + 1)]
def text(xs):
    return f"{statistics.median(xs):.3f} ms (runs {' '.join(f'{x:.3f}' for x in xs)})"
one, nccl, bf16 = runs("one"), runs("nccl1"), runs("bf16wire")
base = statistics.median(one)
print("overhead at world size 1 (GPT-2 124M bf16 16 x 1024, median step of steps 6-30): "
      f"one process {text(one)}; --dist nccl (fp32 on the wire) {text(nccl)}: "
      f"{100 * (statistics.median(nccl) / base - 1):+.2f}%; --comm-dtype bf16 {text(bf16)}: "
      f"{100 * (statistics.median(bf16) / base - 1):+.2f}%")
PY
fi

if [ "$gpus" -lt 2 ] && { part two || part sweep || part fault; }; then
  say "two, sweep, fault: skipped (one GPU)"
fi
two="$mpi -np 2"
if [ "$gpus" -ge 2 ] && part two; then
  # ---- issue 19: two GPUs against one, the same total batch ----
  train_run gpt2_bf16_1gpu "" "$gpt2 --dtype bf16 --steps $steps --total-batch-size 32768"
  train_run gpt2_bf16_2gpu "$two" "$gpt2 --dtype bf16 --steps $steps"
  train_run gpt2_bf16_2gpu_zero "$two" "$gpt2 --dtype bf16 --steps $steps --zero 1"
  compare gpt2_bf16_1gpu gpt2_bf16_2gpu "--threshold-bf16 1e-2"
  compare gpt2_bf16_1gpu gpt2_bf16_2gpu_zero "--threshold-bf16 1e-2"
  say "  gpt2_bf16_2gpu: $(peaks gpt2_bf16_2gpu); zero 1: $(peaks gpt2_bf16_2gpu_zero)"
  train_run gpt2_fp32_1gpu "" "$gpt2 --dtype fp32 --steps 10 --total-batch-size 32768"
  train_run gpt2_fp32_2gpu "$two" "$gpt2 --dtype fp32 --steps 10"
  compare gpt2_fp32_1gpu gpt2_fp32_2gpu "--threshold-fp32 1e-5"
  llama="--model llama3-1b --attention flash --batch-size 4 --seq-len 2048 --dtype bf16 --steps 20"
  train_run llama1b_1gpu "" "$llama --total-batch-size 16384"
  train_run llama1b_2gpu "$two" "$llama"
  train_run llama1b_2gpu_zero "$two" "$llama --zero 1"
  compare llama1b_1gpu llama1b_2gpu "--threshold-bf16 1e-2"
  say "  llama1b_2gpu: $(peaks llama1b_2gpu); zero 1: $(peaks llama1b_2gpu_zero)"
fi
if [ "$gpus" -ge 2 ] && part sweep; then
  # ---- the sweep on every GPU against one ----
  start=$(date +%s)
  $ft sweep --device 0 --json "$out/sweep_1gpu.json" >"$out/sweep_1gpu.log" 2>&1
  say "sweep --device 0: exit $? $(($(date +%s) - start)) s"
  start=$(date +%s)
  $ft sweep --gpus all --json "$out/sweep_all.json" >"$out/sweep_all.log" 2>&1
  say "sweep --gpus all: exit $? $(($(date +%s) - start)) s"
fi
if [ "$gpus" -ge 2 ] && part fault; then
  # ---- a fault: rank 1 killed mid-run; the job must end non-zero within 60 s ----
  rm -f "$out"/fault_pid.*
  $two sh -c "echo \$\$ > $out/fault_pid.\$OMPI_COMM_WORLD_RANK; exec $ft $common $gpt2 \
    --dtype bf16 --steps 100000 --log $out/fault.jsonl" >"$out/fault.log" 2>&1 &
  job=$!
  for _ in $(seq 600); do
    [ "$(grep -c train_loss "$out/fault.jsonl" 2>/dev/null)" -ge 5 ] 2>/dev/null && break
    sleep 0.2
  done
  killed=$(date +%s%N)
  kill -9 "$(cat "$out/fault_pid.1")"
  wait $job
  rc=$?
  say "fault: rank 1 killed after $(grep -c train_loss "$out/fault.jsonl") steps; job exit $rc" \
    "$((($(date +%s%N) - killed) / 1000000)) ms later; $(grep -m1 -E 'rank 1|signal' "$out/fault.log")"
fi
cat "$summary"
