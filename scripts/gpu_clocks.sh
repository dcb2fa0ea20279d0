#!/usr/bin/env bash
# Runs a command on the GPU machine while nvidia-smi samples the SM clock, the power draw and the
# temperature every 100 ms, then prints one line: the command's time (the "median_ms" that
# bench_attention_gpu and torch_attention_peer.py print: give it one case and one direction), the
# median SM clock and power of the samples taken while the card was busy (power above BUSY_W,
# default 250 W, after the first SKIP_S seconds, default 1.5: nvidia-smi's power is an average
# over about a second, so the first samples still show what ran before), and the cycles a call
# took at that clock (ms x MHz). Kernels that run at the card's power limit are timed by their
# energy: two versions at the same cycle count differ only in clock.
#
#   scripts/gpu_clocks.sh main build-gpu/carry/bench_attention_gpu --case hero-causal \
#     --impl flash --dir fwd --warmup-ms 1000 --iters 500
#
# Environment: OUT (default gpu-out; the samples go to OUT/clocks_TAG.csv and the command's
# output to OUT/clocks_TAG.log), BUSY_W, SKIP_S.
set -uo pipefail
tag="${1:?usage: scripts/gpu_clocks.sh TAG COMMAND [ARGS...]}"
shift
[ $# -gt 0 ] || { echo "usage: scripts/gpu_clocks.sh TAG COMMAND [ARGS...]" >&2; exit 2; }
command -v nvidia-smi >/dev/null || { echo "nvidia-smi not found" >&2; exit 2; }
out="${OUT:-gpu-out}"
mkdir -p "$out"
csv="$out/clocks_$tag.csv" log="$out/clocks_$tag.log"
: >"$csv"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits \
  -lms 100 >"$csv" 2>/dev/null &
sampler=$!
"$@" >"$log" 2>&1
rc=$?
kill "$sampler" 2>/dev/null
wait "$sampler" 2>/dev/null
python3 - "$tag" "$csv" "$log" "${BUSY_W:-250}" "$rc" "${SKIP_S:-1.5}" <<'PY'
import re
import statistics
import sys

tag, csv, log, busy_w, rc = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
skip = int(float(sys.argv[6]) * 10)  # samples are 100 ms apart
rows = []
for line in open(csv):
    try:
        rows.append(tuple(float(x) for x in line.split(",")))
    except ValueError:
        pass  # a header or a sample nvidia-smi could not read ("[N/A]")
busy = [r for r in rows[skip:] if len(r) == 3 and r[1] > busy_w]
times = [float(x) for x in re.findall(r'"median_ms":\s*([0-9.eE+-]+)', open(log, errors="replace").read())]
ms = f"{statistics.median(times):.4f} ms" if times else "no median_ms"
if len(times) > 1:
    ms += f" (the median of {len(times)} timings: more than one case or direction)"
if rc != "0":
    print(f"{tag}: the command failed (exit {rc}); see {log}")
elif not busy:
    print(f"{tag}: {ms}; no busy samples ({len(rows)} taken, none above {busy_w:.0f} W)")
else:
    mhz = statistics.median(r[0] for r in busy)
    cycles = f", {statistics.median(times) * mhz / 1000:.3f} M cycles a call" if times else ""
    print(f"{tag}: {ms}; {len(busy)} busy samples: SM clock median {mhz:.0f} MHz "
          f"(range {min(r[0] for r in busy):.0f}-{max(r[0] for r in busy):.0f}), power median "
          f"{statistics.median(r[1] for r in busy):.0f} W, temperature up to "
          f"{max(r[2] for r in busy):.0f} C{cycles}")
PY
exit $rc
