#!/usr/bin/env python3
"""Plots a baseline-vs-test study (PNG): loss curves per case and bars of ms, tok/s and memory.

Usage: scripts/plot_runs.py BASE_DIR TEST_DIR [--summary CSV] [--out DIR]
                            [--base-label baseline] [--test-label flash]

BASE_DIR and TEST_DIR are run directories as `flashtrain compare-loss` reads them (every *.jsonl
and *.log inside is one case, named by its stem; cases pair by name). Writes into --out:
  loss_<case>.png   train loss per step of both sides, and |difference| on a log scale with the
                    dtype's threshold (fp32 1e-5, bf16 1e-2)
  perf.png          grouped bars per case: avg ms, avg tok/s, peak used MB, peak reserved MB,
                    taken from the CSV of `flashtrain summarize --csv` (--summary; by default
                    summary_<base>_vs_<test>.csv beside the two directories, as
                    scripts/run_matrix.py writes it)
This script only draws; `flashtrain compare-loss` is the checker (it rejects malformed logs,
this script skips their bad lines). Needs matplotlib: without it, it says so and exits 3.
"""

import argparse
import csv
import json
import os
import re
import sys

THRESHOLDS = {"fp32": 1e-5, "bf16": 1e-2}
TEXT_STEP = re.compile(r"(?<![\w])step\s+(\d+)/(\d+)\s*\|\s*train loss\s+(\S+)")


def read_log(path):
    """Returns (dtype, {step: loss}); bad lines are skipped with one warning per file."""
    steps, dtype, bad = {}, None, 0
    with open(path, errors="replace") as f:
        for line in f:
            if path.endswith(".jsonl"):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError:
                    bad += 1
                    continue
                if not isinstance(obj, dict):
                    bad += 1
                elif obj.get("event") == "run":
                    dtype = {"bfloat16": "bf16", "float32": "fp32"}.get(obj.get("dtype"),
                                                                         obj.get("dtype"))
                elif "event" not in obj and "step" in obj and "train_loss" in obj:
                    steps[int(obj["step"])] = float(obj["train_loss"])
            else:
                m = TEXT_STEP.search(line)
                if m:
                    try:
                        steps[int(m.group(1))] = float(m.group(3))
                    except ValueError:
                        bad += 1
    if dtype is None:  # text logs: InfiniTrain's rule
        dtype = "bf16" if "_bfloat16" in os.path.basename(path) else "fp32"
    if bad:
        print(f"warning: {path}: skipped {bad} malformed line(s); "
              f"`flashtrain compare-loss` says which", file=sys.stderr)
    return dtype, steps


def run_dir(path):
    runs = {}
    for f in sorted(os.listdir(path)):
        stem, ext = os.path.splitext(f)
        if ext in (".jsonl", ".log"):
            runs[stem] = os.path.join(path, f)
    return runs


def plot_losses(plt, base, test, labels, out):
    from matplotlib.ticker import MaxNLocator  # main() has checked that matplotlib is there
    written = []
    for name in sorted(set(base) & set(test)):
        dtype, b = read_log(base[name])
        _, t = read_log(test[name])
        if not b or not t:
            print(f"note: {name}: no steps on one side; no loss plot")
            continue
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True,
                                          gridspec_kw={"height_ratios": [2, 1]})
        top.plot(sorted(b), [b[s] for s in sorted(b)], label=labels[0], linewidth=2)
        top.plot(sorted(t), [t[s] for s in sorted(t)], label=labels[1], linestyle="--")
        top.set_ylabel("train loss")
        top.set_title(f"{name} ({dtype})")
        top.legend()
        common = sorted(set(b) & set(t))
        diffs = [max(abs(b[s] - t[s]), 1e-12) for s in common]
        bottom.semilogy(common, diffs, marker=".", label="|difference|")
        threshold = THRESHOLDS.get(dtype)
        if threshold:
            bottom.axhline(threshold, color="red", linestyle=":", label=f"threshold {threshold:g}")
        bottom.set_xlabel("step")
        bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
        bottom.set_ylabel("|loss difference|")
        bottom.legend()
        fig.tight_layout()
        path = os.path.join(out, f"loss_{name}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def number(row, key):
    try:
        return float(row.get(key, ""))
    except ValueError:
        return None


def plot_perf(plt, csv_path, labels, out):
    with open(csv_path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if not r.get("problem")]
    if not rows:
        print(f"note: {csv_path}: no summarized case; no bar chart")
        return []
    panels = [("avg ms per step", "ms"), ("avg tok/s", "tok_per_s"),
              ("peak used MB", "peak_used_mb"), ("peak reserved MB", "peak_reserved_mb")]
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(7, 1.1 * len(rows) + 3), 11))
    x = list(range(len(rows)))
    width = 0.4
    for ax, (title, key) in zip(axes, panels):
        for offset, side, label in ((-width / 2, "base", labels[0]), (width / 2, "test", labels[1])):
            values = [number(r, f"{key}_{side}") for r in rows]
            ax.bar([i + offset for i in x], [v if v is not None else 0 for v in values], width,
                   label=label)
            if side == "base":  # a baseline that ran out of memory has no bar: say so
                for i, r in enumerate(rows):
                    if r.get("base_out_of_memory"):
                        ax.text(i + offset, 0, "OOM", ha="center", va="bottom", fontsize=8,
                                color="red")
        ax.set_title(title)
        ax.set_xticks(x)
        ax.set_xticklabels([r["case"] for r in rows], rotation=30, ha="right", fontsize=8)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out, "perf.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def main():
    p = argparse.ArgumentParser(description="Plot loss curves and performance bars of a "
                                            "baseline-vs-test study (PNG).",
                                epilog="Exit status: 0 plots written; 2 bad arguments; "
                                       "3 matplotlib is not installed.")
    p.add_argument("base", help="baseline run directory")
    p.add_argument("test", help="test run directory (e.g. flash)")
    p.add_argument("--summary", help="CSV from `flashtrain summarize --csv` (for the bars)")
    p.add_argument("--out", default="plots", help="output directory (default: plots)")
    p.add_argument("--base-label", default="baseline", help="legend name of BASE")
    p.add_argument("--test-label", default="flash", help="legend name of TEST")
    args = p.parse_args()
    for d in (args.base, args.test):
        if not os.path.isdir(d):
            print(f"error: {d}: not a directory", file=sys.stderr)
            return 2
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_runs.py needs matplotlib, which is not installed here: "
              "`python3 -m pip install matplotlib`; no plots written", file=sys.stderr)
        return 3

    os.makedirs(args.out, exist_ok=True)
    labels = (args.base_label, args.test_label)
    written = plot_losses(plt, run_dir(args.base), run_dir(args.test), labels, args.out)
    summary = args.summary
    if summary is None:
        parent = os.path.dirname(os.path.abspath(args.base))
        guess = os.path.join(parent, "summary_{}_vs_{}.csv".format(
            os.path.basename(os.path.abspath(args.base)),
            os.path.basename(os.path.abspath(args.test))))
        summary = guess if os.path.exists(guess) else None
    if summary:
        written += plot_perf(plt, summary, labels, args.out)
    else:
        print("note: no summary CSV, so no bar chart: run `flashtrain summarize BASE TEST "
              "--csv FILE` and pass --summary FILE")
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
