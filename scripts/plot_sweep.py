#!/usr/bin/env python3
"""Draws the rows of a `flashtrain sweep` that passed the correctness check (PNG).

Usage: scripts/plot_sweep.py SWEEP.json|SWEEP.csv [--out sweep.png] [--title TEXT]

Reads what `flashtrain sweep --json PATH` (or --csv PATH) wrote. One panel per mask: a
horizontal bar per row that passed and was timed, forward and backward stacked (ms), sorted
fastest first; the reference row is grey, the default (base) configuration is outlined, and each
bar is labelled with its vs-ref ratio. Rows that failed the check, were refused or errored are
not drawn: their count is in the panel title, so the chart never hides that they exist (read the
table for why). Needs matplotlib: without it, it says so and exits 3.
"""

import argparse
import csv
import json
import os
import sys


def read_rows(path):
    """Returns (header dict, list of row dicts with the JSON writer's keys)."""
    if path.endswith(".json"):
        with open(path) as f:
            data = json.load(f)
        return data.get("header", {}), data.get("rows", [])
    header, lines = {}, []
    with open(path, newline="") as f:
        for line in f:
            if line.startswith("# "):
                key, _, value = line[2:].partition(": ")
                try:
                    header[key] = json.loads(value)
                except json.JSONDecodeError:
                    header[key] = value.strip()
            else:
                lines.append(line)
    rows = []
    for r in csv.DictReader(lines):
        row = dict(r)
        row["passed"] = r.get("passed") == "1"
        row["timed"] = r.get("timed") == "1"
        row["index"] = int(r.get("index") or -1)
        row["gpu"] = int(r.get("gpu") or 0)
        for key in ("fwd_ms", "bwd_ms", "total_ms", "vs_ref"):
            row[key] = float(r[key]) if r.get(key) else None
        rows.append(row)
    return header, rows


def row_label(row, several_gpus):
    name = "ref" if row["index"] < 0 else "#%d" % row["index"]
    label = "%s fwd %s | bwd %s/%s/%s" % (
        name, row["fwd_tile"], row["bwd_tile"], row["threads"], row["path"])
    return label + (" (gpu %d)" % row["gpu"] if several_gpus else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweep", help="the --json or --csv file of flashtrain sweep")
    ap.add_argument("--out", default=None, help="PNG path (default: beside the input, .png)")
    ap.add_argument("--title", default=None)
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_sweep.py: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
        return 3
    header, rows = read_rows(args.sweep)
    if header.get("dry_run") in (True, "true"):
        print("plot_sweep.py: %s is a --dry-run: nothing was timed" % args.sweep, file=sys.stderr)
        return 1
    masks = []
    for row in rows:
        if row.get("mask") not in masks:
            masks.append(row.get("mask"))
    if not masks:
        print("plot_sweep.py: no rows in %s" % args.sweep, file=sys.stderr)
        return 1
    base = header.get("base_config")
    descriptions = {m.get("key"): m.get("description", "") for m in header.get("masks", [])}
    several_gpus = len({r["gpu"] for r in rows}) > 1

    heights = []
    for mask in masks:
        heights.append(max(1, sum(1 for r in rows if r["mask"] == mask and r["passed"]
                                  and r["timed"])))
    fig, axes = plt.subplots(len(masks), 1, squeeze=False,
                             figsize=(11, 1.2 + sum(0.32 * h + 0.9 for h in heights)),
                             gridspec_kw={"height_ratios": heights})
    for ax, mask in zip(axes[:, 0], masks):
        mine = [r for r in rows if r["mask"] == mask]
        good = sorted((r for r in mine if r["passed"] and r["timed"]),
                      key=lambda r: r["total_ms"])
        others = len(mine) - len(good)
        y = list(range(len(good)))[::-1]
        fwd = [r["fwd_ms"] for r in good]
        bwd = [r["bwd_ms"] for r in good]
        colors_f = ["#9e9e9e" if r["index"] < 0 else "#4c72b0" for r in good]
        colors_b = ["#cfcfcf" if r["index"] < 0 else "#a1c4e8" for r in good]
        # A spilling candidate can be 20x slower than the rest: the axis stops at 3x the median
        # row so that the fast rows stay apart; clipped rows print their time at the edge.
        totals = sorted(r["total_ms"] for r in good)
        limit = 3.0 * totals[len(totals) // 2] if totals else 1.0
        limit = min(limit, max(totals) * 1.15) if totals else limit
        ax.barh(y, fwd, color=colors_f, label="forward")
        bars = ax.barh(y, bwd, left=fwd, color=colors_b, label="backward")
        for yi, bar, r in zip(y, bars, good):
            if r.get("config") == base or (base and "fwd=%s bwd=%s/%s/%s" % (
                    r["fwd_tile"], r["bwd_tile"], r["threads"], r["path"]) == base):
                ax.barh(yi, r["total_ms"], fill=False, edgecolor="#c44e52", linewidth=2)
            ratio = r.get("vs_ref")
            if r["total_ms"] > limit:  # clipped: its time and ratio at the edge
                ax.text(limit, bar.get_y() + bar.get_height() / 2,
                        "%.0f ms, %.2fx  " % (r["total_ms"], ratio or 0), va="center",
                        ha="right", fontsize=8)
            elif ratio:
                ax.text(r["total_ms"], bar.get_y() + bar.get_height() / 2,
                        "  %.2fx" % ratio, va="center", fontsize=8)
        ax.set_yticks(y)
        ax.set_yticklabels([row_label(r, several_gpus) for r in good], fontsize=8)
        ax.set_xlabel("ms (forward + backward, median)")
        ax.set_title("%s %s: %d passed and timed, %d not drawn (failed, refused or error)" % (
            mask, descriptions.get(mask, ""), len(good), others), fontsize=9)
        if good:
            ax.set_xlim(0, limit)
            ax.legend(loc="upper right", fontsize=8)
    gpus = ", ".join("%s (%s)" % (g.get("name"), g.get("arch")) for g in header.get("gpus", []))
    shape = header.get("shape", {})
    title = args.title or "flashtrain sweep on %s: B=%s S=%s Hq=%s Hkv=%s D=%s; red outline = default" % (
        gpus, shape.get("batch"), shape.get("seq_len"), shape.get("q_heads"),
        shape.get("kv_heads"), shape.get("head_dim"))
    fig.suptitle(title, fontsize=10)
    # Leave room for the figure title above the first panel's own title.
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    out = args.out or os.path.splitext(args.sweep)[0] + ".png"
    fig.savefig(out, dpi=120)
    print("wrote %s" % out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
