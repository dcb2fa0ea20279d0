#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root: the same bench_attention_gpu cases for every
# variant carried in build-gpu/variants.tar.xz (scripts/snapshot_variant.sh), in ROUNDS
# alternating rounds (variant order reversed every other round), so that versions of a kernel
# are compared in one call at the same clocks and a drift of the card shows as a spread. Prints
# the median forward and backward ms per case and variant over the rounds, with the range.
#
#   scripts/gpu_variants.sh                                 # every variant, the default cases
#   CASES=hero-causal DIRS=fwd ROUNDS=3 scripts/gpu_variants.sh
#   ARGS='--config "fwd=128x128/384/tma/s2/pp"' scripts/gpu_variants.sh   # more bench flags
#   CONFIGS='bwd=64x192/512/tma;bwd=128x128/384/tma' VARIANTS=main scripts/gpu_variants.sh
#
# Environment: CASES (comma list, default hero-causal,hero-window-docs,gpt2,llama-long), DIRS
# (fwd, bwd or both; default both), ROUNDS (default 2), ARGS (more bench_attention_gpu flags, as
# shell words), CONFIGS (kernel configurations separated by ';', timed one after another in each
# run, their order reversed every other round as the variants' is; one row each), VARIANTS
# (names, default every one), OUT (default gpu-out/variants). Before the rounds it prints which
# kernel families of each variant differ from the first variant's (scripts/kernel_hashes.py;
# "same device code" means the variant's change did not reach its kernels). CLOCKS=1: after the
# rounds, each variant once more on the first case, direction and configuration, CLOCK_ITERS
# calls (default 400) under scripts/gpu_clocks.sh, in the rounds' order and then reversed: the
# SM clock each ran at and the cycles a call took (kernels at the card's power limit differ in
# energy a call, which the clock shows, as well as in cycles).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out="${OUT:-gpu-out}/variants"
mkdir -p "$out"
CARRY_OPTIONAL=1 source scripts/gpu_env.sh || exit 1
if [ ! -d build-gpu/variants ]; then
  # Unpacked aside and moved into place whole: an archive that fails part way (session 50's was
  # written by two snapshots at once) must not leave some binaries behind for the next run to
  # time.
  rm -rf build-gpu/variants.partial
  mkdir -p build-gpu/variants.partial
  if ! tar -C build-gpu/variants.partial -xJf build-gpu/variants.tar.xz; then
    rm -rf build-gpu/variants.partial
    echo "build-gpu/variants.tar.xz is missing or does not unpack (scripts/snapshot_variant.sh)"
    exit 1
  fi
  mv build-gpu/variants.partial/variants build-gpu/variants
  rm -rf build-gpu/variants.partial
fi
read -r -a names <<<"${VARIANTS:-$(ls build-gpu/variants | tr '\n' ' ')}"
extra=()
eval "extra=(${ARGS:-})"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader |
  tee "$out/gpu.txt"
# Each variant's kernels by family against the first variant's (scripts/kernel_hashes.py): a
# variant with the same device code as another cannot differ from it in time.
hashed=()
for v in "${names[@]}"; do hashed+=("$v=build-gpu/variants/$v/bench_attention_gpu"); done
python3 scripts/kernel_hashes.py "${hashed[@]}" | tee "$out/kernels.txt"
status=0
for round in $(seq 1 "${ROUNDS:-2}"); do
  order=("${names[@]}")
  if [ $((round % 2)) -eq 0 ]; then
    order=()
    for ((i = ${#names[@]} - 1; i >= 0; i--)); do order+=("${names[$i]}"); done
  fi
  configs=()
  if [ -n "${CONFIGS:-}" ]; then
    IFS=';' read -r -a list <<<"$CONFIGS"
    if [ $((round % 2)) -eq 0 ]; then
      for ((i = ${#list[@]} - 1; i >= 0; i--)); do configs+=(--config "${list[$i]}"); done
    else
      for c in "${list[@]}"; do configs+=(--config "$c"); done
    fi
  fi
  for v in "${order[@]}"; do
    echo "round $round: $v ($(cat "build-gpu/variants/$v/GIT_COMMIT"))"
    "build-gpu/variants/$v/bench_attention_gpu" --case "${CASES:-hero-causal,hero-window-docs,gpt2,llama-long}" \
      --impl flash --dir "${DIRS:-both}" "${configs[@]}" "${extra[@]}" >"$out/$v.round$round.jsonl" 2>"$out/$v.round$round.log" ||
      { echo "  exit $? ($(tail -1 "$out/$v.round$round.log"))"; status=1; }
  done
done
python3 - "$out" "${names[@]}" <<'PY'
import glob, json, statistics, sys
out, names = sys.argv[1], sys.argv[2:]
rows = {}
for v in names:
    for path in sorted(glob.glob(f"{out}/{v}.round*.jsonl")):
        for line in open(path):
            line = line.strip()
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            if "dir" not in r or "median_ms" not in r:
                continue
            key = (r.get("case", "?"), r["dir"] + (" det" if r.get("deterministic") else ""),
                   r.get("config", ""))
            rows.setdefault(key, {}).setdefault(v, []).append(r["median_ms"])
print("| case | dir | config | " + " | ".join(names) + " |")
print("|---|---|---|" + "---:|" * len(names))
for (case, d, config), by in sorted(rows.items()):
    cells = []
    for v in names:
        ms = by.get(v, [])
        cells.append(f"{statistics.median(ms):.3f} ({min(ms):.3f}-{max(ms):.3f})" if ms else "-")
    print(f"| {case} | {d} | {config or 'default'} | " + " | ".join(cells) + " |")
PY
if [ -n "${CLOCKS:-}" ]; then
  IFS=',' read -r -a case_list <<<"${CASES:-hero-causal}"
  dir="${DIRS:-fwd}"
  [ "$dir" = both ] && dir=fwd
  first_config=()
  if [ -n "${CONFIGS:-}" ]; then first_config=(--config "${CONFIGS%%;*}"); fi
  order=("${names[@]}")
  for ((i = ${#names[@]} - 1; i >= 0; i--)); do order+=("${names[$i]}"); done
  pass=0
  for v in "${order[@]}"; do
    pass=$((pass + 1))
    OUT="$out" scripts/gpu_clocks.sh "$v.$pass" "build-gpu/variants/$v/bench_attention_gpu" \
      --case "${case_list[0]}" --impl flash --dir "$dir" "${first_config[@]}" "${extra[@]}" \
      --warmup-ms 1000 --iters "${CLOCK_ITERS:-400}" || status=1
  done
fi
exit $status
