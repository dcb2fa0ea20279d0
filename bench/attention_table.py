"""Markdown tables from the JSON lines of bench_attention_gpu (flashtrain) and
torch_attention_peer.py (PyTorch): one table per case with forward and backward median ms
(min-max), TFLOP/s and, given the cuBLAS bf16 rate measured in the same call
(--ceilings, bench/gpu_ceilings.py's JSON line), each row's fraction of it; and our flash
kernel's speedup over each row (that row's ms / our flash ms; above 1 means ours is faster).
With several flash configurations (bench_attention_gpu --config A --config B) each gets a row;
the first is "ours". bench/attention_gpu.sh calls it; it also works on saved files:

  python3 bench/attention_table.py out/attention/*.jsonl --gpu-info out/attention/gpu.txt \
      --ceilings out/attention/ceilings.json
"""
import argparse
import json
import sys


def read_rows(paths):
    rows, metas = [], []
    for path in paths:
        try:
            with open(path) as f:
                lines = f.readlines()
        except OSError as e:
            print(f"attention_table: {e}", file=sys.stderr)
            continue
        for line in lines:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            (metas if row.get("meta") else rows).append(row)
    return rows, metas


def header_line(metas, gpu_info):
    ours = next((m for m in metas if m.get("side") == "flashtrain"), {})
    peer = next((m for m in metas if m.get("side") == "pytorch"), {})
    parts = []
    if gpu_info:
        fields = [f.strip() for f in gpu_info.split(",")]
        gpu = fields[0]
        if len(fields) > 1:
            gpu += f" (driver {fields[1]})"
        parts.append(f"GPU: {gpu}")
    else:
        parts.append(f"GPU: {ours.get('gpu') or peer.get('gpu') or 'unknown'}")
    if ours:
        parts.append(f"flashtrain: {ours.get('arch', '?')}, {ours.get('sms', '?')} SMs, "
                     f"CUDA runtime {ours.get('cuda_runtime', '?')}")
    if peer:
        extra = [f"CUDA {peer['cuda']}" if peer.get("cuda") else "",
                 f"cuDNN {peer['cudnn']}" if peer.get("cudnn") else "",
                 f"Triton {peer['triton']}" if peer.get("triton") else ""]
        extra = ", ".join(e for e in extra if e)
        parts.append(f"torch {peer.get('torch', '?')}" + (f" ({extra})" if extra else ""))
    return " · ".join(parts)


def row_key(row):
    return (row["side"], row["impl"], row.get("config", ""))


def label(row, variant):
    name = f"{'ours' if row['side'] == 'flashtrain' else 'torch'} {row['impl']}"
    return name if variant == 0 else f"{name} #{variant + 1}"


def cell_ms(row):
    if not row or "median_ms" not in row:
        return "—"
    return f"{row['median_ms']:.3f} ({row['min_ms']:.3f}–{row['max_ms']:.3f})"


def cell_tflops(row, cublas_tflops):
    if not row or "tflops" not in row:
        return "—"
    if not cublas_tflops:
        return f"{row['tflops']:.1f}"
    return f"{row['tflops']:.1f} ({100 * row['tflops'] / cublas_tflops:.0f}%)"


def cell_speedup(ours, row):
    if not ours or not row or "median_ms" not in ours or "median_ms" not in row:
        return "—"
    return f"{row['median_ms'] / ours['median_ms']:.2f}x"


def note_of(fwd, bwd):
    notes = []
    for d, row in (("fwd", fwd), ("bwd", bwd)):
        if not row:
            continue
        if row.get("note") and row["note"] not in notes:
            notes.append(row["note"])
        if row.get("config") and f"config {row['config']}" not in notes:
            notes.append(f"config {row['config']}")
        if row.get("error"):
            text = " ".join(row["error"].split())
            text = text if len(text) <= 160 else text[:157] + "..."
            entry = f"{d}: {text}" if not (fwd and bwd and fwd.get("error") == bwd.get("error")) \
                else text
            if entry not in notes:
                notes.append(entry)
    return "; ".join(notes).replace("|", "\\|")


def case_title(case, rows):
    r = next((r for r in rows if "pairs" in r), rows[0])
    names = (("B", "batch"), ("S", "seq_len"), ("Hq", "q_heads"), ("Hkv", "kv_heads"),
             ("D", "head_dim"))
    shape = " ".join(f"{k}={r.get(key, '?')}" for k, key in names)
    pairs = f"{r['pairs']:.3e} attended pairs" if "pairs" in r else "attended pairs unknown"
    return f"### {case}: {shape} {r.get('dtype', '?')}, mask {r.get('mask', '?')}, {pairs}"


def case_table(case, rows, cublas_tflops=None):
    impls = []
    for row in rows:
        key = row_key(row)
        if key not in impls:
            impls.append(key)
    impls.sort(key=lambda k: (k[0] != "flashtrain", k[1] != "flash"))  # stable: config order
    get = {row_key(r) + (r["dir"],): r for r in rows}
    ours = impls[0] if impls and impls[0][:2] == ("flashtrain", "flash") else None
    ours_fwd = get.get(ours + ("fwd",)) if ours else None
    ours_bwd = get.get(ours + ("bwd",)) if ours else None
    lines = [case_title(case, rows), ""]
    pair_counts = {r["side"]: r["pairs"] for r in rows if "pairs" in r}
    if len(set(pair_counts.values())) > 1:
        lines += [f"**warning: the sides count different attended pairs: {pair_counts}**", ""]
    rate = " (% of cuBLAS)" if cublas_tflops else ""
    lines += [f"| impl | fwd ms (min–max) | bwd ms (min–max) | fwd TFLOP/s{rate} "
              f"| bwd TFLOP/s{rate} | ours fwd speedup | ours bwd speedup | note |",
              "|---|---|---|---|---|---|---|---|"]
    variants = {}
    for key in impls:
        fwd, bwd = get.get(key + ("fwd",)), get.get(key + ("bwd",))
        variant = variants.setdefault(key[:2], 0)
        variants[key[:2]] += 1
        is_ours = key == ours
        lines.append("| " + " | ".join([
            label(fwd or bwd, variant), cell_ms(fwd), cell_ms(bwd),
            cell_tflops(fwd, cublas_tflops), cell_tflops(bwd, cublas_tflops),
            "—" if is_ours else cell_speedup(ours_fwd, fwd),
            "—" if is_ours else cell_speedup(ours_bwd, bwd), note_of(fwd, bwd)]) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="JSON lines files of either side")
    ap.add_argument("--gpu-info", help="a file holding nvidia-smi's 'name, driver_version' line")
    ap.add_argument("--ceilings", help="bench/gpu_ceilings.py's JSON line (cuBLAS bf16 rate)")
    args = ap.parse_args(argv)
    cublas_tflops = None
    if args.ceilings:
        try:
            with open(args.ceilings) as f:
                cublas_tflops = json.loads(f.readline()).get("bf16_matmul_tflops")
        except (OSError, ValueError) as e:
            print(f"attention_table: no ceilings from {args.ceilings}: {e}", file=sys.stderr)
    rows, metas = read_rows(args.files)
    gpu_info = None
    if args.gpu_info:
        try:
            with open(args.gpu_info) as f:
                gpu_info = f.readline().strip() or None
        except OSError:
            pass
    print(f"## Attention, flashtrain beside PyTorch\n\n{header_line(metas, gpu_info)}\n")
    print("Median of timed calls (CUDA events), min–max in brackets; TFLOP/s from attended pairs "
          "(4·pairs·D forward, 2.5× that backward); speedup = that row's ms / our flash ms "
          "(above 1: ours is faster).")
    if cublas_tflops:
        print(f"cuBLAS bf16 8192³ in the same call: {cublas_tflops} TFLOP/s "
              "(bench/gpu_ceilings.py); the percentages are of that rate.")
    print()
    cases = []
    for row in rows:
        if row["case"] not in cases:
            cases.append(row["case"])
    if not cases:
        print("(no measurements)")
        return 1
    for case in cases:
        print(case_table(case, [r for r in rows if r["case"] == case], cublas_tflops) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
