#!/usr/bin/env python3
"""The open performance issues' bars against one call's measurements: each bar, our figure, the
peer's, the ratio and whether the bar is met.

Reads what bench/attention_gpu.sh writes (attention_flashtrain.jsonl and attention_pytorch.jsonl:
issue 14's forward and issue 16's backward bars, ours against cuDNN through SDPA or FlexAttention)
and what bench/gpu_train.sh writes (ft_NAME.log and torch_NAME.json: issue 17's training steps
against torch.compile, tok/s and peak memory), from any of the directories given, and names the
GPU: the bars are defined on the H200, and a figure from another card says so. Where the
attention bench ran with --deterministic, a second table gives the deterministic backward's cost
beside the default's per case (issue 16 asks for it in the bars' call). A third table gives
issue 17's long-context rows that have no ratio: whether ours trained at 65536 and 131072
positions, with tok/s and peak memory, and PyTorch eager beside ours at 32768 (running out of
memory is a result, reported as one).

  python3 bench/bars.py gpu-out/attn gpu-out/train32k gpu-out/train
  python3 bench/bars.py --json docs/results/session44/call3_h100
  python3 bench/bars.py --part long      # what bench/bars.sh runs for a part (PARTS, below)
"""
import argparse
import glob
import json
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_table import read_rows  # noqa: E402  (the benches' JSON-lines reader)

# (issue, case, direction, peer impl, at least this many times faster than the peer).
ATTENTION_BARS = [
    (14, "hero-causal", "fwd", "sdpa-cudnn", 1.05),
    (14, "gpt2", "fwd", "sdpa-cudnn", 1.0),
    (14, "hero-window-docs", "fwd", "flex", 1.5),
    (14, "llama-long", "fwd", "sdpa-cudnn", 1.0),
    (14, "hero-d256", "fwd", "sdpa-cudnn", 1.0),
    (16, "hero-causal", "bwd", "sdpa-cudnn", 1.05),
    (16, "gpt2", "bwd", "sdpa-cudnn", 1.0),
    (16, "hero-window-docs", "bwd", "flex", 1.5),
    (16, "llama-long", "bwd", "sdpa-cudnn", 1.0),
]
# (issue, bench/gpu_train.sh row, tok/s at least this many times torch.compile's, peak memory:
# "at most" torch.compile's or strictly "less than" it).
TRAIN_BARS = [
    (17, "gpt2_bf16_b16_compile", 1.1, "at most"),
    (17, "llama1b_bf16_compile", 1.1, "at most"),
    (17, "llama1b_32k_compile", 1.1, "less than"),
]
# (issue, bench/gpu_train.sh row, whose peer is reported beside ours): long-context rows whose bar
# is that ours trains, tok/s and peak memory reported.
LONG_ROWS = [
    (17, "llama1b_32k", "PyTorch eager"),
    (17, "llama1b_64k", None),
    (17, "llama1b_128k", None),
]
# What bench/bars.sh measures, part by part (each part sized for one 10-minute device call): the
# attention bench's cases of ATTENTION_BARS, and the gpu_train.sh rows of TRAIN_BARS and LONG_ROWS.
PARTS = {
    "attention": list(dict.fromkeys(case for _, case, _, _, _ in ATTENTION_BARS)),
    "compile": ["gpt2_bf16_b16_compile", "llama1b_bf16_compile"],
    "long": ["llama1b_32k", "llama1b_32k_compile", "llama1b_64k", "llama1b_128k"],
}
assert sorted(PARTS["compile"] + PARTS["long"]) == sorted(
    [name for _, name, _, _ in TRAIN_BARS] + [name for _, name, _ in LONG_ROWS])


def attention_rows(dirs):
    """{(case, dir): ms} of ours (the first flash configuration: the default, not deterministic,
    not packed), {(case, dir, impl): ms} of the peers and {case: ms} of our first deterministic
    backward, with the GPU names seen."""
    ours, peers, deterministic, gpus = {}, {}, {}, set()
    for d in dirs:
        rows, metas = read_rows(glob.glob(os.path.join(d, "attention_flashtrain.jsonl")))
        for r in rows:
            if r.get("impl") != "flash" or str(r.get("config", "")).endswith(" packed"):
                continue
            if not r.get("deterministic"):
                ours.setdefault((r["case"], r["dir"]), r["median_ms"])
            elif r["dir"] == "bwd":
                deterministic.setdefault(r["case"], r["median_ms"])
        peer_rows, peer_metas = read_rows(glob.glob(os.path.join(d, "attention_pytorch.jsonl")))
        for r in peer_rows:
            if r.get("median_ms") is not None:
                peers[(r["case"], r["dir"], r["impl"])] = r["median_ms"]
        gpus.update(m.get("gpu", "?") for m in metas + peer_metas)
    return ours, peers, deterministic, gpus


_STEPS = re.compile(r"^steps .*\| ([0-9.]+) tok/s")
_LOSS = re.compile(r"^steps \d+ \| final train loss (\S+) \|")
# Each step's line: the only peak that older logs print.
_STEP_PEAK = re.compile(r"^step .*peak used: ([0-9.]+) MB")
_PEAK = re.compile(r"peak used ([0-9.]+) MB over the run, ([0-9.]+) MB over the timed steps")


def read_train_log(path):
    """flashtrain train's log: (tok/s, final loss, the run's peak MB, the timed steps' peak MB),
    None where the log has no such line (older logs print the peak only on each step's line)."""
    tok = loss = run_peak = timed_peak = None
    with open(path) as f:
        for line in f:
            if (m := _STEPS.match(line)):
                tok = float(m.group(1))
            if (m := _LOSS.match(line)):
                loss = float(m.group(1))
            if (m := _PEAK.search(line)):
                run_peak, timed_peak = float(m.group(1)), float(m.group(2))
            elif (m := _STEP_PEAK.match(line)):
                run_peak = max(run_peak or 0.0, float(m.group(1)))
    return tok, loss, run_peak, timed_peak


def train_rows(dirs):
    """{row: (ours tok/s, ours timed peak MB, peer tok/s, peer timed peak MB, GPU)}."""
    out = {}
    for d in dirs:
        for log in glob.glob(os.path.join(d, "ft_*.log")):
            name = os.path.basename(log)[3:-4]
            peer_path = os.path.join(d, f"torch_{name}.json")
            tok, _, _, peak = read_train_log(log)
            peer = None
            if os.path.exists(peer_path):
                peer = next((r for r in read_rows([peer_path])[0] if "tok_per_s" in r), None)
            if tok is None or peer is None:
                continue
            peer_peak = peer.get("timed_peak_allocated_mb", peer.get("peak_allocated_mb"))
            out[name] = (tok, peak, float(peer["tok_per_s"]), peer_peak, peer.get("gpu", "?"))
    return out


def deterministic_costs(ours, deterministic):
    """Per case with both rows: the default backward, the deterministic one and their ratio."""
    return [{"case": case, "default_ms": ours[(case, "bwd")], "deterministic_ms": ms,
             "cost": ms / ours[(case, "bwd")]}
            for case, ms in deterministic.items() if (case, "bwd") in ours]


def long_rows(dirs):
    """LONG_ROWS as found: ours (tok/s, the run's peak MB, whether it trained: a summary with a
    finite final loss) and the named peer's tok/s or its error."""
    out = []
    for issue, name, peer_name in LONG_ROWS:
        for d in dirs:
            log = os.path.join(d, f"ft_{name}.log")
            if not os.path.exists(log):
                continue
            tok, loss, peak, _ = read_train_log(log)
            trained = tok is not None and loss is not None and math.isfinite(loss)
            row = {"issue": issue, "row": name, "trained": trained,
                   "ours": (f"{tok:,.0f} tok/s" + (f", {peak:,.0f} MB" if peak else "")
                            if trained else "no summary (see the log)")}
            peer_path = os.path.join(d, f"torch_{name}.json")
            if peer_name and os.path.exists(peer_path):
                peer = next((r for r in read_rows([peer_path])[0]
                             if "tok_per_s" in r or "error" in r), None)
                if peer is not None and "error" in peer:
                    mb = peer.get("peak_allocated_mb")
                    row["peer"] = f"{peer_name}: {peer['error']}" + (
                        f" ({mb:,} MB allocated)" if mb else "")
                elif peer is not None:
                    row["peer"] = (f"{peer_name}: {float(peer['tok_per_s']):,.0f} tok/s, "
                                   f"{peer.get('peak_allocated_mb', 0):,} MB")
            out.append(row)
            break
    return out


def verdicts(dirs):
    ours, peers, deterministic, gpus = attention_rows(dirs)
    rows = []
    for issue, case, direction, impl, bar in ATTENTION_BARS:
        mine, theirs = ours.get((case, direction)), peers.get((case, direction, impl))
        if mine is None or theirs is None:
            continue
        ratio = theirs / mine
        rows.append({"issue": issue, "bar": f"{case} {direction} >= {bar:g}x {impl}",
                     "ours": f"{mine:.3f} ms", "peer": f"{theirs:.3f} ms", "ratio": ratio,
                     "met": ratio >= bar})
    steps = train_rows(dirs)
    for issue, name, speed, memory in TRAIN_BARS:
        if name not in steps:
            continue
        tok, peak, peer_tok, peer_peak, gpu = steps[name]
        gpus.add(gpu)
        ratio = tok / peer_tok
        memory_met = peak is not None and peer_peak is not None and (
            peak <= peer_peak if memory == "at most" else peak < peer_peak)
        rows.append({"issue": issue,
                     "bar": f"{name} >= {speed:g}x torch.compile tok/s, peak {memory} its",
                     "ours": f"{tok:,.0f} tok/s, {peak:,.0f} MB" if peak else f"{tok:,.0f} tok/s",
                     "peer": f"{peer_tok:,.0f} tok/s, {peer_peak:,.0f} MB",
                     "ratio": ratio, "met": ratio >= speed and memory_met})
    for d in dirs:  # the GPU the training bench's rows ran on (gpu_ceilings.py's line)
        for r in read_rows(glob.glob(os.path.join(d, "ceilings.json")))[0]:
            gpus.add(r.get("gpu", "?"))
    return rows, deterministic_costs(ours, deterministic), long_rows(dirs), sorted(gpus)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="*", help="directories with the benches' outputs")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    ap.add_argument("--part", choices=sorted(PARTS),
                    help="print what bench/bars.sh runs for this part (the attention cases, "
                         "comma-separated, or gpu_train.sh's rows) and exit")
    args = ap.parse_args()
    if args.part:
        print(("," if args.part == "attention" else " ").join(PARTS[args.part]))
        return
    if not args.dirs:
        ap.error("give the directories with the benches' outputs (or --part)")
    missing = [d for d in args.dirs if not os.path.isdir(d)]
    if missing:
        sys.exit(f"bars: not a directory: {', '.join(missing)}")
    rows, costs, longs, gpus = verdicts(args.dirs)
    if not rows and not longs:
        sys.exit("bars: no bench output found (attention_*.jsonl, ft_*.log with torch_*.json)")
    if args.json:
        print(json.dumps({"gpus": gpus, "bars": rows, "deterministic": costs, "long": longs}))
        return
    print(f"GPU: {', '.join(gpus) or 'unknown'}" + (
        "" if gpus and all("H200" in g for g in gpus) else " (the bars are defined on the H200)"))
    tables = []
    if rows:
        tables.append(["| issue | bar | ours | peer | ratio | met |",
                       "|---|---|---|---|---:|---|"] + [
            f"| {r['issue']} | {r['bar']} | {r['ours']} | {r['peer']} | {r['ratio']:.3f}x | "
            f"{'yes' if r['met'] else '**no**'} |" for r in rows])
    if costs:
        tables.append(["| case | backward ms | deterministic backward ms | cost |",
                       "|---|---:|---:|---:|"] + [
            f"| {c['case']} | {c['default_ms']:.3f} | {c['deterministic_ms']:.3f} | "
            f"{c['cost']:.2f}x |" for c in costs])
    if longs:
        tables.append(["| issue | row | ours | beside it | trained |", "|---|---|---|---|---|"] + [
            f"| {r['issue']} | {r['row']} | {r['ours']} | {r.get('peer', '-')} | "
            f"{'yes' if r['trained'] else '**no**'} |" for r in longs])
    print("\n\n".join("\n".join(t) for t in tables))


if __name__ == "__main__":
    main()
