#!/usr/bin/env python3
"""Summarises the SASS source page of one Nsight Compute report, as written by
`ncu -i REPORT --page source --csv --print-source sass` (scripts/gpu_profile.sh writes it):

- the executed warp instructions by opcode, with each opcode's share of the stall samples;
- where the report has stall samples, the waits: each mbarrier wait site (a try-wait and the
  branch that loops back to it), keyed by its barrier operand's constant offset, with its share
  of the samples and how many times it was tried; the warpgroup product waits
  (WARPGROUP.DEPBAR) and the named barriers (BAR.SYNC, BAR.ARV) as two more rows.

A barrier operand such as `[UR18+0x18a00]` keeps its constant (`+0x18a00`): the offset from the
block's shared-memory base that the kernel's layout gives the barrier (a ring slot's index is
often in the register, so one site can cover the barriers of every slot of a ring).

    python3 scripts/ncu_sass_summary.py profile/forward_sass.csv [--top 15]
"""

import argparse
import collections
import csv
import re
import sys

STALLS = "Warp Stall Sampling (All Samples)"
BARRIER_OPERAND = re.compile(r"\[[^\]]*?(\+0x[0-9a-fA-F]+)\]")


def opcode(source):
    words = source.split()
    if not words:
        return ""
    return (words[1] if words[0].startswith("@") and len(words) > 1 else words[0]).split(".")[0]


def read(path):
    """The page's instruction rows as (source, executed, samples or None); [] without a page."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header = next((i for i, r in enumerate(rows) if "Source" in r and "Instructions Executed" in r),
                  None)
    if header is None:
        return [], False
    hdr = rows[header]
    src, executed = hdr.index("Source"), hdr.index("Instructions Executed")
    stalls = hdr.index(STALLS) if STALLS in hdr else None
    out = []
    for r in rows[header + 1:]:
        if len(r) <= max(src, executed, stalls or 0) or not r[executed].strip().isdigit():
            continue
        samples = int(float(r[stalls] or 0)) if stalls is not None else None
        out.append((r[src].strip(), int(r[executed]), samples))
    return out, stalls is not None


def wait_kind(rows, i):
    """The wait row instruction i belongs to, or None: an mbarrier wait site (the try-wait, or
    the branch right after it that loops on it), a warpgroup product wait or a named barrier."""
    source = rows[i][0]
    for s in (source, rows[i - 1][0] if i > 0 and opcode(source) == "BRA" else ""):
        if "TRYWAIT" in s:
            m = BARRIER_OPERAND.search(s)
            return "mbarrier wait " + (m.group(1) if m else "(register address)")
    if "WARPGROUP.DEPBAR" in source:
        return "warpgroup product wait"
    if opcode(source) == "BAR" and ("SYNC" in source or "ARV" in source or "RED" in source):
        return "named barrier"
    return None


def summarise(rows, has_stalls, top=15):
    lines = []
    count, stall = collections.Counter(), collections.Counter()
    for source, executed, samples in rows:
        op = opcode(source)
        count[op] += executed
        stall[op] += samples or 0
    total, samples_total = sum(count.values()), sum(stall.values())
    lines.append(f"executed warp instructions {total:,}; by opcode (share"
                 + (", stall-sample share):" if has_stalls else "; no stall samples collected):"))
    for op, n in count.most_common(top):
        line = f"  {op:12s} {100 * n / max(1, total):5.1f}%"
        if has_stalls:
            line += f"  {100 * stall[op] / max(1, samples_total):5.1f}%"
        lines.append(line)
    if not has_stalls or samples_total == 0:
        return lines
    waits = collections.defaultdict(lambda: [0, 0])  # kind -> [samples, tries]
    for i, (source, executed, samples) in enumerate(rows):
        kind = wait_kind(rows, i)
        if kind is None:
            continue
        waits[kind][0] += samples or 0
        if opcode(source) != "BRA":  # the wait instruction itself counts the tries
            waits[kind][1] += executed
    lines.append(f"waits (share of the {samples_total:,} stall samples; times executed):")
    for kind, (s, tries) in sorted(waits.items(), key=lambda kv: -kv[1][0]):
        lines.append(f"  {kind:34s} {100 * s / samples_total:5.1f}%  {tries:>14,}")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    parser.add_argument("--top", type=int, default=15, help="opcodes to list (default 15)")
    args = parser.parse_args()
    try:
        rows, has_stalls = read(args.csv)
    except OSError as e:
        sys.exit(f"ncu_sass_summary: {e}")
    if not rows:
        print(f"ncu_sass_summary: no SASS source page in {args.csv} (a section set without "
              "source counters?)")
        return
    print("\n".join(summarise(rows, has_stalls, args.top)))


if __name__ == "__main__":
    main()
