#!/usr/bin/env python3
"""Per-kernel census of one training step from Nsight Compute's CSV.

Reads the CSV that

  ncu --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \\
      --log-file step.csv build/flashtrain train ... --steps 2

writes (scripts/gpu_census.sh runs exactly that on the GPU machine), takes the launches of one
training step and prints, per kernel name, the time of its launches, how many there were, the
DRAM bytes they read and wrote and the rate that makes, sorted by time: the table docs/PERF.md
quotes as "a kernel census". Kernels run one at a time under Nsight Compute, so the times add up
to the step's kernel time, not its wall time.

Steps: the launches are cut before every launch whose kernel name matches --boundary (default
`embedding_forward`, the first kernel of a flashtrain step's forward); step 1 runs from the
first such launch to the second, and so on; the zero-grad launches just before a forward count
with the step before. --step picks one (default: the last, which runs to the end of the file).

Only the time metric is required; without the DRAM metrics the byte and rate columns read "-".
Exit status: 0, or 2 for a file that is not such a CSV (with the reason).
"""
import argparse
import collections
import csv
import json
import re
import sys

TIME_METRIC = "gpu__time_duration.sum"
BYTE_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
TIME_UNITS = {"ns": 1e-9, "nsecond": 1e-9, "us": 1e-6, "usecond": 1e-6, "ms": 1e-3,
              "msecond": 1e-3, "s": 1.0, "second": 1.0}
BYTE_UNITS = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6,
              "GB": 1e9}


class CensusError(Exception):
    pass


def short_name(name):
    """A kernel's name without its parameter list, return type and our namespaces."""
    name = re.sub(r"^void ", "", name)
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # the parameter list: the first '(' outside template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    name = name[:cut]
    for prefix in ("ft::nn::cuda::", "ft::attention::cuda::", "ft::", "(anonymous namespace)::",
                   "<unnamed>::"):
        name = name.replace(prefix, "")
    return name


def read_launches(path):
    """[(id, kernel name, {metric: value in seconds or bytes})] in launch order."""
    launches = collections.OrderedDict()
    header = None
    with open(path, newline="") as f:
        for line_no, row in enumerate(csv.reader(f), start=1):
            if not row or row[0].startswith("=="):  # ==PROF== / ==WARNING== lines
                continue
            if header is None:
                if "ID" not in row or "Metric Name" not in row:
                    raise CensusError(f"{path}:{line_no}: expected Nsight Compute's CSV header "
                                      f"(ID, ..., Kernel Name, ..., Metric Name, Metric Unit, "
                                      f"Metric Value), got {row[:4]}")
                header = {name: i for i, name in enumerate(row)}
                continue
            try:
                launch = int(row[header["ID"]])
                name = row[header["Kernel Name"]]
                metric = row[header["Metric Name"]]
                unit = row[header["Metric Unit"]]
                value = float(row[header["Metric Value"]].replace(",", ""))
            except (IndexError, ValueError) as e:
                raise CensusError(f"{path}:{line_no}: not a metric row ({e})") from None
            if metric == TIME_METRIC:
                if unit not in TIME_UNITS:
                    raise CensusError(f"{path}:{line_no}: unknown time unit {unit!r}")
                value *= TIME_UNITS[unit]
            elif metric in BYTE_METRICS:
                if unit not in BYTE_UNITS:
                    raise CensusError(f"{path}:{line_no}: unknown byte unit {unit!r}")
                value *= BYTE_UNITS[unit]
            entry = launches.setdefault(launch, (name, {}))
            entry[1][metric] = value
    if header is None:
        raise CensusError(f"{path}: no Nsight Compute CSV header")
    if not launches:
        raise CensusError(f"{path}: no kernel launches")
    if not any(TIME_METRIC in m for _, m in launches.values()):
        raise CensusError(f"{path}: no {TIME_METRIC} values (profile with --metrics "
                          f"{TIME_METRIC},...)")
    return [(i, name, metrics) for i, (name, metrics) in sorted(launches.items())]


def split_steps(launches, boundary):
    """The launches of each step: from one boundary launch to the next."""
    pattern = re.compile(boundary)
    starts = [k for k, (_, name, _) in enumerate(launches) if pattern.search(name)]
    if not starts:
        raise CensusError(f"no kernel matches the step boundary {boundary!r}")
    return [launches[a:b] for a, b in zip(starts, starts[1:] + [len(launches)])]


def census(step_launches):
    """Rows {kernel, launches, seconds, bytes (None without DRAM metrics)}, longest first."""
    rows = collections.OrderedDict()
    for _, name, metrics in step_launches:
        row = rows.setdefault(short_name(name), {"kernel": short_name(name), "launches": 0,
                                                 "seconds": 0.0, "bytes": 0.0, "has_bytes": True})
        row["launches"] += 1
        row["seconds"] += metrics.get(TIME_METRIC, 0.0)
        if all(m in metrics for m in BYTE_METRICS):
            row["bytes"] += sum(metrics[m] for m in BYTE_METRICS)
        else:
            row["has_bytes"] = False
    out = []
    for row in rows.values():
        out.append({"kernel": row["kernel"], "launches": row["launches"],
                    "seconds": row["seconds"], "bytes": row["bytes"] if row["has_bytes"] else None})
    return sorted(out, key=lambda r: -r["seconds"])


def format_table(rows, step, n_steps, top):
    total = sum(r["seconds"] for r in rows)
    launches = sum(r["launches"] for r in rows)
    lines = [f"step {step} of {n_steps}: {launches} launches, {total * 1e3:.3f} ms of kernel time",
             f"{'us':>10} {'launches':>8} {'% time':>7} {'MB':>9} {'TB/s':>6}  kernel"]
    for r in rows[:top] if top else rows:
        mb = f"{r['bytes'] / 1e6:9.1f}" if r["bytes"] is not None else f"{'-':>9}"
        rate = (f"{r['bytes'] / r['seconds'] / 1e12:6.2f}"
                if r["bytes"] is not None and r["seconds"] > 0 else f"{'-':>6}")
        share = 100.0 * r["seconds"] / total if total > 0 else 0.0
        lines.append(f"{r['seconds'] * 1e6:10.1f} {r['launches']:8d} {share:6.1f}% {mb} {rate}  "
                     f"{r['kernel']}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Per-kernel time and DRAM traffic of one training step, from the CSV of "
                    "`ncu --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,"
                    "dram__bytes_write.sum --log-file FILE flashtrain train ...`.")
    ap.add_argument("csv", help="Nsight Compute's CSV (--csv --log-file)")
    ap.add_argument("--step", type=int, default=0,
                    help="which step (1 = the first); default: the last")
    ap.add_argument("--boundary", default="embedding_forward",
                    help="regular expression on kernel names: a step starts at each launch that "
                         "matches (default: %(default)s)")
    ap.add_argument("--top", type=int, default=0, help="print only the N longest kernels")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = ap.parse_args(argv)
    try:
        steps = split_steps(read_launches(args.csv), args.boundary)
        step = args.step or len(steps)
        if not 1 <= step <= len(steps):
            raise CensusError(f"--step {args.step}: the file has steps 1 to {len(steps)}")
        rows = census(steps[step - 1])
    except (CensusError, OSError) as e:
        print(f"kernel_census: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"step": step, "steps": len(steps), "kernels": rows}))
    else:
        print(format_table(rows, step, len(steps), args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
