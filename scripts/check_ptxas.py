#!/usr/bin/env python3
"""Compiles every CUDA source of the build again with ptxas's report (-Xptxas -v), the exact
commands of BUILD/compile_commands.json, and checks what the CUDA compile alone cannot show:

- fails where ptxas serialised a kernel's warpgroup products ("wgmma.mma_async instructions are
  serialized", C7514/C7515/...) or injected a warpgroup wait ("warpgroup.wait is injected",
  C7517): every product then waits for the one before, which no test notices (the results are
  the same) and which costs most of a kernel's speed;
- fails where it injected a warpgroup arrive ("warpgroup.arrive is injected", C7519) into a
  kernel of the tma family (flash_tma_forward.cuh, flash_tma_backward.cuh: issue 14 asks for none);
  elsewhere (the older wgmma kernels) it reports them;
- fails where a tma forward kernel without segment ids spills (its plans are sized to fit the
  consumer registers: tma_plans.h; a spill there means a plan outgrew its estimate);
- prints each tma kernel's registers and spilled bytes (--table), for docs/PERF.md.

Usage: scripts/check_ptxas.py [BUILD] [--jobs N] [--table]   (BUILD: build; scripts/test.sh runs
it after the build). Exit 0: clean; 1: a finding above; 2: no CUDA sources in the build.
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

SERIALISED = re.compile(r"wgmma\.mma_async instructions are serialized|warpgroup\.wait is injected")
ARRIVE = re.compile(r"warpgroup\.arrive is injected")
FUNCTION = re.compile(r"function '([^']+)'")
TMA_KERNEL = re.compile(r"tma_(forward|backward)_kernel")
# A tma kernel's mangled name: its direction, plan and whether it reads segment ids.
TMA_INSTANCE = re.compile(r"tma_(forward|backward)_kernelILi(\d+)ELb([01])E")


def tma_instance(mangled):
    """(direction, plan, segment ids) of a tma kernel's mangled name, or None."""
    m = TMA_INSTANCE.search(mangled)
    return (m.group(1), int(m.group(2)), m.group(3) == "1") if m else None


def report(command, src, out_dir):
    """ptxas's -v report of one translation unit (stderr), compiled to a scratch object."""
    args = shlex.split(command)
    if "-o" in args:
        args[args.index("-o") + 1] = os.path.join(out_dir, os.path.basename(src) + ".o")
    args += ["-Xptxas", "-v"]
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        return src, None, done.stderr
    return src, done.stdout + done.stderr, ""


def classify(line):
    """"finding" (a serialised product, an injected wait, or an arrive in a tma kernel),
    "arrive" (an injected arrive elsewhere) or None, for one line of ptxas's report."""
    if SERIALISED.search(line):
        return "finding"
    if ARRIVE.search(line):
        fn = FUNCTION.search(line)
        return "finding" if fn is None or TMA_KERNEL.search(fn.group(1)) else "arrive"
    return None


def spills_where_none_expected(name, registers, stored, loaded):
    """A tma forward kernel without segment ids that spills."""
    kernel = tma_instance(name)
    return kernel is not None and kernel[0] == "forward" and not kernel[2] and stored + loaded > 0


def table_order(mangled):
    """The table's order: the forward kernels, then the backward ones, each by plan."""
    direction, plan, segments = tma_instance(mangled)
    return direction != "forward", plan, segments


def short_name(mangled):
    """tma_forward_kernel<PLAN, SEG> for a tma kernel's mangled name, else the name."""
    kernel = tma_instance(mangled)
    if kernel is None:
        return mangled
    return f"tma_{kernel[0]}_kernel<{kernel[1]}, {'true' if kernel[2] else 'false'}>"


def kernel_table(text):
    """(kernel, registers, spill store bytes, spill load bytes) of each tma kernel in a report."""
    rows, current = [], None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            current = m.group(1)
            spills = None
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and current:
            spills = (int(m.group(1)), int(m.group(2)))
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and current and TMA_KERNEL.search(current):
            rows.append((current, int(m.group(1))) + (spills or (0, 0)))
            current = None
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build", nargs="?", default="build", help="build directory (default: build)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="compiles at once")
    ap.add_argument("--table", action="store_true", help="print the tma kernels' registers")
    opts = ap.parse_args()
    path = os.path.join(opts.build, "compile_commands.json")
    if not os.path.exists(path):
        print(f"check_ptxas: no {path} (configure the build first)", file=sys.stderr)
        return 2
    entries = [e for e in json.load(open(path))
               if e["file"].endswith(".cu") and "/src/" in e["file"]]
    if not entries:
        print(f"check_ptxas: no CUDA sources in {path} (a build without CUDA)", file=sys.stderr)
        return 2
    findings, arrives, table = [], [], []
    with tempfile.TemporaryDirectory() as scratch, ThreadPoolExecutor(opts.jobs) as pool:
        for src, text, error in pool.map(lambda e: report(e["command"], e["file"], scratch),
                                         entries):
            if text is None:
                findings.append(f"{src}: the compile failed:\n{error}")
                continue
            for line in text.splitlines():
                finding = classify(line)
                if finding == "finding":
                    findings.append(f"{os.path.relpath(src)}: {line.strip()}")
                elif finding == "arrive":
                    arrives.append(FUNCTION.search(line).group(1))
            for row in kernel_table(text):
                table.append(row)
                if spills_where_none_expected(*row):
                    findings.append(f"{os.path.relpath(src)}: {short_name(row[0])} spills "
                                    f"{row[2]} bytes, reloads {row[3]} (none expected)")
    if opts.table:
        print(f"{'tma kernel <plan, segment ids>':<36} {'registers':>9} {'spill stores':>12} "
              f"{'spill loads':>11}")
        # forward before backward, then by plan (tma kernels only are in the table)
        for name, regs, st, ld in sorted(table, key=lambda row: table_order(row[0])):
            print(f"{short_name(name):<36} {regs:>9} {st:>12} {ld:>11}")
    if arrives:
        kernels = sorted(set(arrives))
        print(f"check_ptxas: {len(arrives)} warpgroup arrives injected (C7519) in "
              f"{len(kernels)} kernels outside the tma family (known: docs/PERF.md)")
    for f in findings:
        print(f"check_ptxas: {f}", file=sys.stderr)
    print(f"check_ptxas: {len(entries)} CUDA sources, {len(table)} tma kernels, "
          f"{len(findings)} findings")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
