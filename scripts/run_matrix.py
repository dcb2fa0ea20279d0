#!/usr/bin/env python3
"""Runs a matrix of training cases (e.g. naive vs flash attention), then compares them.

Usage: scripts/run_matrix.py CONFIG [--logdir DIR] [--cli PATH] [--only GLOB ...] [--dry-run]
                             [--timeout SECONDS] [--plot]

CONFIG is JSON (configs/cpu_smoke.json, configs/gpu_study.json):
  {
    "description": "free text",
    "defaults": {<case settings>},
    "cases":    [{"name": ..., <case settings>}, ...],
    "groups":   {"baseline": {"attention": "naive"}, "flash": {"attention": "flash"}},
    "compare":  [{"base": "baseline", "test": "flash"}]
  }
Case settings: model, dtype (fp32|bf16), batch, seq_len, attention (naive|flash), steps,
device (cpu|cuda|auto; optional), flags (extra `flashtrain train` arguments, a list of strings)
and note (free text). Every group runs every case of "cases" (or its own "cases" list, when it
has one). A setting comes from the group if the group sets it, else from the case, else from
"defaults"; flags add up (defaults, then case, then group). The group is the experimental factor,
so its settings win.

Writes, under the log directory:
  environment.json          GPU, driver, CUDA, compiler, git commit, CPU, ... (once per run)
  config.json               the config as run
  <group>/<case>.jsonl      the training log (`flashtrain train --log`)
  <group>/<case>.out        its stdout and stderr
  matrix.json               per case: command, exit status, seconds
  compare-loss_<base>_vs_<test>.md, summary_<base>_vs_<test>.{md,csv}
                            `flashtrain compare-loss` and `flashtrain summarize` on each pair
  plots_<base>_vs_<test>/   with --plot (scripts/plot_runs.py; needs matplotlib: without it,
                            --plot is refused before any case runs, exit 2)
A case that fails is reported and the matrix goes on. A case of a base group (a "base" of
"compare") whose log records that it ran out of memory is not a failed case: compare-loss and
summarize report it as a baseline that does not fit. Exit status: 0 every case ran (or, in a
base group, ran out of memory) and every comparison passed; 1 a case or a comparison failed;
a plot that could not be drawn is a failed comparison; 2 a bad config or command line (or --plot
without matplotlib).
Standard library only.
"""

import argparse
import datetime
import fnmatch
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASE_KEYS = {"name", "model", "dtype", "batch", "seq_len", "attention", "steps", "device",
             "flags", "note"}
REQUIRED = ["name", "model", "dtype", "batch", "seq_len", "attention", "steps"]
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


class ConfigError(Exception):
    pass


def check_settings(where, settings, allow_name):
    if not isinstance(settings, dict):
        raise ConfigError(f"{where}: expected an object, got {type(settings).__name__}")
    keys = set(settings) - {"cases"}
    unknown = keys - CASE_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown setting(s) {sorted(unknown)}; "
                          f"known: {sorted(CASE_KEYS)}")
    if not allow_name and "name" in settings:
        raise ConfigError(f"{where}: 'name' belongs to a case")
    flags = settings.get("flags", [])
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        raise ConfigError(f"{where}: 'flags' must be a list of strings, got {flags!r}")


def check_case(where, case):
    for key in REQUIRED:
        if key not in case:
            raise ConfigError(f"{where}: missing '{key}' (set it in the case, its group or "
                              f"'defaults')")
    if not isinstance(case["name"], str) or not NAME_RE.match(case["name"]):
        raise ConfigError(f"{where}: name {case['name']!r}: use letters, digits, '_', '.', "
                          f"'+', '-' (it becomes a file name)")
    if case["dtype"] not in ("fp32", "bf16"):
        raise ConfigError(f"{where}: dtype {case['dtype']!r}: expected fp32 or bf16")
    if case["attention"] not in ("naive", "flash"):
        raise ConfigError(f"{where}: attention {case['attention']!r}: expected naive or flash")
    if case.get("device", "auto") not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"{where}: device {case['device']!r}: expected auto, cpu or cuda")
    for key in ("batch", "seq_len", "steps"):
        v = case[key]
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"{where}: {key} {v!r}: expected an integer >= 1")


def load_config(path):
    """Returns (config, runs, comparisons); runs are (group, case) in config order."""
    try:
        with open(path) as f:
            config = json.load(f)
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror}")
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg})")
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: expected a JSON object at the top")
    unknown = set(config) - {"description", "defaults", "cases", "groups", "compare"}
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {sorted(unknown)}")
    defaults = config.get("defaults", {})
    check_settings(f"{path}: defaults", defaults, allow_name=False)
    shared = config.get("cases", [])
    groups = config.get("groups")
    if not isinstance(groups, dict) or not groups:
        raise ConfigError(f"{path}: 'groups' must be an object with at least one group")
    runs = []
    for group, settings in groups.items():
        if not NAME_RE.match(group):
            raise ConfigError(f"{path}: group name {group!r}: use letters, digits, '_', '.', '-'")
        check_settings(f"{path}: groups.{group}", settings, allow_name=False)
        cases = settings.get("cases", shared)
        if not isinstance(cases, list) or not cases:
            raise ConfigError(f"{path}: groups.{group}: no cases (give 'cases' at the top or in "
                              f"the group)")
        seen = set()
        for i, case in enumerate(cases):
            where = f"{path}: groups.{group}, case {i + 1}"
            check_settings(where, case, allow_name=True)
            merged = dict(defaults)
            merged.update(case)
            merged.update({k: v for k, v in settings.items() if k != "cases"})
            merged["flags"] = (defaults.get("flags", []) + case.get("flags", []) +
                               settings.get("flags", []))
            check_case(where, merged)
            if merged["name"] in seen:
                raise ConfigError(f"{where}: case name {merged['name']!r} appears twice")
            seen.add(merged["name"])
            runs.append((group, merged))
    comparisons = config.get("compare", [])
    if not isinstance(comparisons, list):
        raise ConfigError(f"{path}: 'compare' must be a list of {{\"base\": ..., \"test\": ...}}")
    for i, c in enumerate(comparisons):
        if not isinstance(c, dict) or set(c) != {"base", "test"}:
            raise ConfigError(f"{path}: compare[{i}]: expected {{\"base\": GROUP, \"test\": GROUP}}")
        for side in ("base", "test"):
            if c[side] not in groups:
                raise ConfigError(f"{path}: compare[{i}].{side}: no group {c[side]!r}")
    return config, runs, comparisons


def train_command(cli, case, log_path):
    cmd = [cli, "train", "--model", case["model"], "--dtype", case["dtype"],
           "--batch-size", str(case["batch"]), "--seq-len", str(case["seq_len"]),
           "--attention", case["attention"], "--steps", str(case["steps"])]
    if "device" in case:
        cmd += ["--device", case["device"]]
    return cmd + case["flags"] + ["--log", log_path]


# ---- environment ----

def capture(cmd, cwd=REPO):
    try:
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def compilers_in_binary(path):
    """The compiler versions recorded in the binary's .comment section (GCC: (...) 12.2.0)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return []
    found = re.findall(rb"(?:GCC: \([^)\n]*\) [0-9][0-9.]*|clang version [0-9][0-9.]*)", data)
    return sorted({s.decode(errors="replace") for s in found})


def cmake_compilers(cli):
    """Compiler ids and versions from the CMake build directory that holds the CLI, if any."""
    out = {}
    files = os.path.join(os.path.dirname(os.path.abspath(cli)), "CMakeFiles")
    if not os.path.isdir(files):
        return out
    for sub in sorted(os.listdir(files)):
        for lang in ("CXX", "CUDA"):
            p = os.path.join(files, sub, f"CMake{lang}Compiler.cmake")
            if not os.path.exists(p):
                continue
            with open(p) as f:
                text = f.read()
            ident = re.search(rf'set\(CMAKE_{lang}_COMPILER_ID "([^"]*)"\)', text)
            ver = re.search(rf'set\(CMAKE_{lang}_COMPILER_VERSION "([^"]*)"\)', text)
            if ident and ver:
                out[lang.lower()] = f"{ident.group(1)} {ver.group(1)}"
    return out


def gpu_info():
    line = capture(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                    "--format=csv,noheader"])
    gpus = []
    if line:
        for row in line.splitlines():
            parts = [p.strip() for p in row.split(",")]
            if len(parts) == 3:
                gpus.append({"name": parts[0], "driver": parts[1], "memory": parts[2]})
    header = capture(["nvidia-smi"]) or ""
    m = re.search(r"CUDA Version:\s*([0-9.]+)", header)
    return gpus, (m.group(1) if m else None)


def environment(cli, config_path):
    gpus, cuda_driver = gpu_info()
    nvcc = capture(["nvcc", "--version"]) or capture(["/usr/local/cuda/bin/nvcc", "--version"])
    nvcc_release = re.search(r"release ([0-9.]+)", nvcc or "")
    cpu = None
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"^model name\s*:\s*(.*)$", f.read(), re.M)
            cpu = m.group(1) if m else None
    except OSError:
        pass
    commit = capture(["git", "rev-parse", "HEAD"])
    dirty = capture(["git", "status", "--porcelain", "--untracked-files=no"])
    commit_source = "checkout" if commit else None
    # Binaries carried to another machine (scripts/build_gpu.sh) name the commit they were built
    # from in GIT_COMMIT beside them ("<hash>" or "<hash> dirty"): that one, not the checkout's.
    built = binary_commit(cli)
    if built is not None:
        commit, dirty, commit_source = built[0], ("dirty" if built[1] else ""), "binary"
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": platform.node(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "gpus": gpus,
        "gpu": gpus[0]["name"] if gpus else None,
        "driver": gpus[0]["driver"] if gpus else None,
        "cuda_driver_api": cuda_driver,
        "nvcc_on_path": nvcc_release.group(1) if nvcc_release else None,
        "compiler_in_binary": compilers_in_binary(cli),
        "compilers_cmake": cmake_compilers(cli),
        "git_commit": commit or os.environ.get("FLASHTRAIN_GIT_COMMIT"),
        "git_dirty": (dirty != "") if commit is not None and dirty is not None else None,
        "git_commit_source": commit_source,
        "cli": cli,
        "config": os.path.abspath(config_path),
    }


def binary_commit(cli):
    """(hash, dirty) from the GIT_COMMIT file beside the CLI binary, or None."""
    path = os.path.join(os.path.dirname(os.path.abspath(cli)), "GIT_COMMIT")
    try:
        with open(path) as f:
            words = f.read().split()
    except OSError:
        return None
    if not words:
        return None
    return words[0], "dirty" in words[1:]


# ---- running ----

def tail(path, n=3):
    try:
        with open(path, errors="replace") as f:
            lines = [line.rstrip() for line in f if line.strip()]
    except OSError:
        return []
    return lines[-n:]


def run_case(cmd, out_path, timeout):
    start = time.monotonic()
    with open(out_path, "w") as out:
        try:
            r = subprocess.run(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                               timeout=timeout)
            status = "ok" if r.returncode == 0 else f"exit {r.returncode}"
            code = r.returncode
        except subprocess.TimeoutExpired:
            status, code = f"timeout after {timeout} s", None
        except OSError as e:
            status, code = f"could not start: {e.strerror}", None
    return status, code, time.monotonic() - start


def recorded_failure(log):
    """The {"event": "error"} line a training run wrote before it stopped, or None."""
    try:
        with open(log, errors="replace") as f:
            for line in f:
                if '"event":"error"' in line.replace(" ", ""):
                    try:
                        return json.loads(line)
                    except json.JSONDecodeError:
                        return None
    except OSError:
        pass
    return None


def run_report(cmd, md_path):
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    with open(md_path, "w") as f:
        f.write(r.stdout)
        if r.stderr:
            f.write("\n" + r.stderr)
    sys.stdout.write(r.stdout)
    sys.stdout.write(r.stderr)
    return r.returncode


def warn_stale_logs(logdir, runs):
    """Logs in a group directory that are no case of this config would be compared too."""
    names = {(g, c["name"]) for g, c in runs}
    for group in sorted({g for g, _ in runs}):
        d = os.path.join(logdir, group)
        if not os.path.isdir(d):
            continue
        for f in sorted(os.listdir(d)):
            stem, ext = os.path.splitext(f)
            if ext in (".jsonl", ".log") and (group, stem) not in names:
                print(f"warning: {os.path.join(d, f)} is no case of this config but will be "
                      f"compared too; remove it or use a fresh --logdir")


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def have_matplotlib():
    try:
        import matplotlib  # noqa: F401  (scripts/plot_runs.py draws with it)
    except ImportError:
        return False
    return True


def main():
    p = argparse.ArgumentParser(
        description="Run a matrix of training cases, then compare-loss and summarize each "
                    "configured pair of groups.",
        epilog="Exit status: 0 every case ran (or, in a base group, ran out of memory) and "
               "every comparison passed; 1 a case or a comparison failed; 2 a bad config or "
               "command line.")
    p.add_argument("config", help="matrix config (JSON), e.g. configs/cpu_smoke.json")
    p.add_argument("--logdir", help="where the logs go (default: runs/<config name>)")
    p.add_argument("--cli", default=os.environ.get("FLASHTRAIN_CLI", "build/flashtrain"),
                   help="the flashtrain binary, relative to the repository root or absolute "
                        "(default: $FLASHTRAIN_CLI or build/flashtrain)")
    p.add_argument("--only", nargs="+", metavar="GLOB",
                   help="run only cases whose 'group/case' matches one of these globs")
    p.add_argument("--timeout", type=float, help="seconds allowed per case (default: no limit)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--plot", action="store_true",
                   help="also draw plots with scripts/plot_runs.py (needs matplotlib)")
    args = p.parse_args()

    if args.plot and not args.dry_run and not have_matplotlib():
        print("error: --plot needs matplotlib, which this python3 cannot import "
              "(python3 -m pip install matplotlib, or run without --plot)", file=sys.stderr)
        return 2
    try:
        config, runs, comparisons = load_config(args.config)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.only:
        runs = [(g, c) for g, c in runs
                if any(fnmatch.fnmatch(f"{g}/{c['name']}", pat) for pat in args.only)]
        if not runs:
            print(f"error: --only {' '.join(args.only)} matches no case", file=sys.stderr)
            return 2
    cli = args.cli if os.path.isabs(args.cli) else os.path.join(REPO, args.cli)
    stem = os.path.splitext(os.path.basename(args.config))[0]
    logdir = os.path.abspath(args.logdir or os.path.join(REPO, "runs", stem))

    if args.dry_run:
        for group, case in runs:
            log = os.path.join(logdir, group, case["name"] + ".jsonl")
            print(" ".join(shlex.quote(a) for a in train_command(cli, case, log)))
        return 0
    if not os.access(cli, os.X_OK):
        print(f"error: --cli {cli}: not an executable (build it first: scripts/build.sh)",
              file=sys.stderr)
        return 2

    os.makedirs(logdir, exist_ok=True)
    env = environment(cli, args.config)
    write_json(os.path.join(logdir, "environment.json"), env)
    write_json(os.path.join(logdir, "config.json"), config)
    print(f"matrix: {args.config}: {len(runs)} cases into {logdir}")
    cuda = env["compilers_cmake"].get("cuda") or (
        f"nvcc {env['nvcc_on_path']} on PATH" if env["nvcc_on_path"] else "-")
    print(f"environment: gpu {env['gpu'] or 'none'}, driver {env['driver'] or '-'}, "
          f"cuda {cuda}, "
          f"compiler {', '.join(env['compiler_in_binary']) or '-'}, "
          f"commit {env['git_commit'] or 'unknown'}{' (dirty)' if env['git_dirty'] else ''}")

    if not args.only:
        warn_stale_logs(logdir, runs)
    results, failed, out_of_memory = [], [], []
    base_groups = {c["base"] for c in comparisons}
    for i, (group, case) in enumerate(runs, 1):
        os.makedirs(os.path.join(logdir, group), exist_ok=True)
        log = os.path.join(logdir, group, case["name"] + ".jsonl")
        out = os.path.join(logdir, group, case["name"] + ".out")
        if os.path.exists(log):
            os.remove(log)  # a stale log from an earlier run must not pass for this one
        cmd = train_command(cli, case, log)
        label = f"{group}/{case['name']}"
        print(f"[{i}/{len(runs)}] {label} ...", end=" ", flush=True)
        status, code, seconds = run_case(cmd, out, args.timeout)
        failure = recorded_failure(log) if status != "ok" else None
        if failure and failure.get("kind") == "out_of_memory" and group in base_groups:
            # A baseline that does not fit is a result, not a broken case: compare-loss and
            # summarize report it ("base OOM"). Any other group's run out of memory fails.
            status = f"out of memory in step {failure.get('step')}"
            print(f"{status} ({seconds:.1f} s): {failure.get('message', '')}", flush=True)
        else:
            print(f"{status} ({seconds:.1f} s)", flush=True)
        if status.startswith("out of memory"):
            out_of_memory.append(label)
        elif status != "ok":
            failed.append(label)
            for line in tail(out):
                print(f"    {line}")
            print(f"    FAILED: {label}; output in {out}; continuing with the next case")
        results.append({"group": group, "case": case["name"], "status": status,
                        "exit_code": code, "seconds": round(seconds, 3), "command": cmd,
                        "log": log, "output": out, "note": case.get("note")})
        write_json(os.path.join(logdir, "matrix.json"), {"environment": env, "cases": results})

    report_failures = []
    for c in comparisons:
        base, test = os.path.join(logdir, c["base"]), os.path.join(logdir, c["test"])
        if not os.path.isdir(base) or not os.path.isdir(test):
            continue  # --only ran neither side
        pair = f"{c['base']}_vs_{c['test']}"
        print(f"\n== compare-loss {c['base']} vs {c['test']} ==")
        rc = run_report([cli, "compare-loss", base, test],
                        os.path.join(logdir, f"compare-loss_{pair}.md"))
        if rc != 0:
            report_failures.append(f"compare-loss {pair} (exit {rc})")
        print(f"\n== summarize {c['base']} vs {c['test']} ==")
        rc = run_report([cli, "summarize", base, test, "--base-label", c["base"],
                         "--test-label", c["test"], "--csv",
                         os.path.join(logdir, f"summary_{pair}.csv")],
                        os.path.join(logdir, f"summary_{pair}.md"))
        if rc != 0:
            report_failures.append(f"summarize {pair} (exit {rc})")
        if args.plot:
            rc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "plot_runs.py"),
                                 base, test, "--summary",
                                 os.path.join(logdir, f"summary_{pair}.csv"), "--out",
                                 os.path.join(logdir, f"plots_{pair}"), "--base-label",
                                 c["base"], "--test-label", c["test"]]).returncode
            if rc != 0:
                report_failures.append(f"plots {pair} (plot_runs.py exit {rc})")

    print(f"\nmatrix: {len(runs) - len(failed) - len(out_of_memory)}/{len(runs)} cases ran; "
          f"logs in {logdir}")
    for label in out_of_memory:
        print(f"  out of memory: {label} (its log says so; the reports judge it)")
    for label in failed:
        print(f"  failed case: {label}")
    for r in report_failures:
        print(f"  failed report: {r}")
    return 1 if failed or report_failures else 0


if __name__ == "__main__":
    sys.exit(main())
